// CUDA dense kernels (cuBLAS linear, activations, BCE, DLRM interaction) and the NCCL helpers
// against the CPU implementations (strata::nn) or a float64 reference.
#include "cuda/test_support.cuh"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <string>
#include <thread>

#include "cuda/cpu_reference.hpp"
#include "strata/cuda/dense.cuh"
#if defined(STRATA_TEST_NCCL)
#include "strata/cuda/nccl.cuh"
#endif

namespace sc = strata::cuda;
namespace cuda_test = strata::cuda_test;
using strata::cuda_test::skip_without_gpu;

namespace {
/// |got − want| ≤ 1e-5 · scale[i] (+ tiny), where scale is Σ|terms| of each value's sum.
void require_close_scaled(const std::vector<float>& got, const std::vector<double>& want,
                          const std::vector<double>& scale) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const bool ok = std::fabs(got[i] - want[i]) <= 1e-5 * scale[i] + 1e-7;
    if (!ok) {
      CAPTURE(i, got[i], want[i], scale[i]);
      REQUIRE(ok);
    }
  }
}
}  // namespace

TEST_CASE("cuda: linear forward/backward through cuBLAS equals a float64 reference", "[cuda]") {
  if (skip_without_gpu()) return;
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  sc::stream s;
  sc::blas h(s);
  const std::size_t batch = 37, in = 53, out = 29;
  const auto x = cuda_test::random_floats(gen, batch * in);
  const auto w = cuda_test::random_floats(gen, out * in);
  const auto b = cuda_test::random_floats(gen, out);
  const auto dy = cuda_test::random_floats(gen, batch * out);
  for (const bool relu : {false, true}) {
    CAPTURE(relu);
    sc::device_buffer<float> dx_(std::span<const float>(x), s), dw_(std::span<const float>(w), s),
        db_(std::span<const float>(b), s), ddy(std::span<const float>(dy), s);
    auto y = cuda_test::poisoned(batch * out, s);
    sc::linear::forward(h, dx_.data(), dw_.data(), db_.data(), y.data(), batch, in, out, relu, s);
    std::vector<double> want(batch * out), scale(batch * out);
    for (std::size_t r = 0; r < batch; ++r)
      for (std::size_t o = 0; o < out; ++o) {
        double acc = b[o], mag = std::fabs(b[o]);
        for (std::size_t k = 0; k < in; ++k) {
          acc += double{x[r * in + k]} * w[o * in + k];
          mag += std::fabs(double{x[r * in + k]} * w[o * in + k]);
        }
        want[r * out + o] = relu ? std::max(acc, 0.0) : acc;
        scale[r * out + o] = mag;
      }
    require_close_scaled(y.download(), want, scale);

    auto gw = cuda_test::poisoned(out * in, s), gb = cuda_test::poisoned(out, s),
         gx = cuda_test::poisoned(batch * in, s);
    sc::linear::backward(h, dx_.data(), dw_.data(), ddy.data(), gw.data(), gb.data(), gx.data(),
                         batch, in, out, relu, s);
    std::vector<double> ww(out * in), sw(out * in), wb(out), sb(out), wx(batch * in),
        sx(batch * in);
    for (std::size_t o = 0; o < out; ++o)
      for (std::size_t k = 0; k < in; ++k)
        for (std::size_t r = 0; r < batch; ++r) {
          ww[o * in + k] += double{dy[r * out + o]} * x[r * in + k];
          sw[o * in + k] += std::fabs(double{dy[r * out + o]} * x[r * in + k]);
        }
    for (std::size_t o = 0; o < out; ++o)
      for (std::size_t r = 0; r < batch; ++r) {
        wb[o] += dy[r * out + o];
        sb[o] += std::fabs(dy[r * out + o]);
      }
    for (std::size_t r = 0; r < batch; ++r)
      for (std::size_t k = 0; k < in; ++k) {
        for (std::size_t o = 0; o < out; ++o) {
          wx[r * in + k] += double{dy[r * out + o]} * w[o * in + k];
          sx[r * in + k] += std::fabs(double{dy[r * out + o]} * w[o * in + k]);
        }
        if (relu && !(x[r * in + k] > 0.0f)) wx[r * in + k] = 0.0;
      }
    require_close_scaled(gw.download(), ww, sw);
    require_close_scaled(gb.download(), wb, sb);
    require_close_scaled(gx.download(), wx, sx);
  }
}

TEST_CASE("cuda: relu, sigmoid and bce_with_logits equal strata::nn", "[cuda]") {
  if (skip_without_gpu()) return;
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  sc::stream s;
  const std::size_t n = 10007;
  auto x = cuda_test::random_floats(gen, n, -30.0f, 30.0f);
  const auto dy = cuda_test::random_floats(gen, n);
  auto labels = cuda_test::random_floats(gen, n, 0.0f, 1.0f);
  sc::device_buffer<float> dx(std::span<const float>(x), s), ddy(std::span<const float>(dy), s),
      dl(std::span<const float>(labels), s);
  auto y = cuda_test::poisoned(n, s), g = cuda_test::poisoned(n, s);
  sc::relu::forward(dx.data(), y.data(), n, s);
  const auto ry = cuda_test::relu_forward(x);
  cuda_test::require_bits_equal(y.download(), ry);
  sc::relu::backward(y.data(), ddy.data(), g.data(), n, s);
  cuda_test::require_bits_equal(g.download(), cuda_test::relu_backward(ry, dy));
  {  // NaN stays NaN and −0 stays −0, as on the CPU
    const std::vector<float> special = {std::nanf(""),
                                        -0.0f,
                                        0.0f,
                                        -1.0f,
                                        1.0f,
                                        std::numeric_limits<float>::infinity(),
                                        -std::numeric_limits<float>::infinity(),
                                        std::numeric_limits<float>::denorm_min(),
                                        -std::numeric_limits<float>::denorm_min()};
    sc::device_buffer<float> in(std::span<const float>(special), s);
    auto out = cuda_test::poisoned(special.size(), s);
    sc::relu::forward(in.data(), out.data(), special.size(), s);
    cuda_test::require_bits_equal(out.download(), cuda_test::relu_forward(special));
  }
  sc::sigmoid::forward(dx.data(), y.data(), n, s);
  const auto sy = cuda_test::sigmoid_forward(x);
  cuda_test::require_close(y.download(), sy);
  sc::device_buffer<float> dsy(std::span<const float>(sy), s);
  sc::sigmoid::backward(dsy.data(), ddy.data(), g.data(), n, s);
  cuda_test::require_close(g.download(), cuda_test::sigmoid_backward(sy, dy));
  std::vector<float> want_grad;
  const double want = cuda_test::bce(x, labels, want_grad, 0.5f);
  sc::bce_with_logits loss(s);
  auto grad = cuda_test::poisoned(n, s);
  const double got = loss(dx.data(), dl.data(), n, grad.data(), 0.5f);
  CHECK(std::fabs(got - want) <= 1e-9 * std::fabs(want));
  cuda_test::require_close(grad.download(), want_grad);
}

TEST_CASE("cuda: DLRM interaction forward/backward equals nn::interaction", "[cuda]") {
  if (skip_without_gpu()) return;
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  sc::stream s;
  const std::size_t batch = 19, dim = 16, features = 5;
  const std::size_t cols = dim + (features + 1) * features / 2;
  const auto z = cuda_test::random_floats(gen, batch * dim);
  std::vector<std::vector<float>> emb;
  std::vector<sc::device_buffer<float>> demb_buf, gemb_buf;
  std::vector<const float*> eptr;
  std::vector<float*> gptr;
  for (std::size_t f = 0; f < features; ++f) {
    emb.push_back(cuda_test::random_floats(gen, batch * dim));
    demb_buf.emplace_back(std::span<const float>(emb.back()), s);
    gemb_buf.push_back(cuda_test::poisoned(batch * dim, s));
    eptr.push_back(demb_buf.back().data());
    gptr.push_back(gemb_buf.back().data());
  }
  sc::device_buffer<const float*> de(std::span<const float* const>(eptr), s);
  sc::device_buffer<float*> dg(std::span<float* const>(gptr), s);
  sc::device_buffer<float> dz(std::span<const float>(z), s);
  auto out = cuda_test::poisoned(batch * cols, s);
  sc::interaction::forward(dz.data(), de.data(), batch, features, dim, out.data(), s);
  cuda_test::require_close(out.download(), cuda_test::interaction_forward(batch, dim, z, emb), 1e-5,
                           1e-6);
  const auto dout = cuda_test::random_floats(gen, batch * cols);
  sc::device_buffer<float> ddout(std::span<const float>(dout), s);
  auto gz = cuda_test::poisoned(batch * dim, s);
  sc::interaction::backward(dz.data(), de.data(), batch, features, dim, ddout.data(), gz.data(),
                            dg.data(), s);
  std::vector<float> want_dz;
  std::vector<std::vector<float>> want_de;
  cuda_test::interaction_backward(batch, dim, z, emb, dout, want_dz, want_de);
  cuda_test::require_close(gz.download(), want_dz, 1e-5, 1e-6);
  for (std::size_t f = 0; f < features; ++f)
    cuda_test::require_close(gemb_buf[f].download(), want_de[f], 1e-5, 1e-6);
  // Deterministic: a second backward gives the same bits.
  auto gz2 = cuda_test::poisoned(batch * dim, s);
  sc::interaction::backward(dz.data(), de.data(), batch, features, dim, ddout.data(), gz2.data(),
                            dg.data(), s);
  cuda_test::require_bits_equal(gz2.download(), gz.download());
}

#if defined(STRATA_TEST_NCCL)
TEST_CASE("cuda: check(ncclResult_t) throws with the NCCL message", "[cuda]") {
  try {
    STRATA_CHECK(ncclInvalidArgument);
    FAIL("no throw");
  } catch (const strata::error& e) {
    CHECK(std::string(e.what()).find("ncclInvalidArgument") != std::string::npos);
  }
}

TEST_CASE("cuda: nccl_allreduce on a one-rank communicator is the identity", "[cuda]") {
  if (skip_without_gpu()) return;
  sc::stream s;
  ncclUniqueId id = sc::make_unique_id();
  CHECK(sc::id_bytes(id).size() == sizeof(ncclUniqueId));
  sc::communicator comm(id, 0, 1);
  const std::vector<float> x{1.0f, -2.0f, 3.5f};
  sc::device_buffer<float> d(std::span<const float>(x), s);
  auto r = cuda_test::poisoned(3, s);
  sc::nccl_allreduce(comm, d.data(), r.data(), 3, s);
  cuda_test::require_bits_equal(r.download(), x);
  CHECK_THROWS_AS(sc::communicator(id, 2, 1), strata::error);
}

TEST_CASE("cuda: the NCCL id travels through a shared file to the other ranks", "[cuda]") {
  if (skip_without_gpu()) return;
  const auto where =
      std::filesystem::temp_directory_path() / ("strata_nccl_id_" + std::to_string(::getpid()));
  std::filesystem::remove(where);
  ncclUniqueId seen{};
  std::thread other([&] { seen = sc::unique_id_via_file(where, 1, 30.0); });
  const ncclUniqueId made = sc::unique_id_via_file(where, 0);
  other.join();
  CHECK(std::memcmp(&seen, &made, sizeof(ncclUniqueId)) == 0);
  // The id works: a one-rank communicator made from it.
  sc::communicator comm(made, 0, 1);
  CHECK(comm.size() == 1);
  // A leftover file is refused rather than handing a stale id to the next job.
  CHECK_THROWS_AS(sc::unique_id_via_file(where, 0), strata::error);
  std::filesystem::remove(where);
}
#endif

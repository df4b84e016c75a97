// CUDA embedding and compression kernels against the CPU implementations (the reference).
#include "cuda/test_support.cuh"

#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <string>

#include "cuda/cpu_reference.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/compress/topk.hpp"
#include "strata/cuda/compress.cuh"
#include "strata/cuda/embedding.cuh"

namespace optim = strata::optim;
namespace embedding = strata::embedding;
namespace compress = strata::compress;
namespace cuda_test = strata::cuda_test;
using strata::errc;
namespace sc = strata::cuda;
using strata::cuda_test::skip_without_gpu;

TEST_CASE("cuda: check throws strata::error naming the call and the place", "[cuda]") {
  // Host-only: runs without a GPU.
  try {
    sc::check(cudaErrorInvalidValue, "cudaMemcpy(dst, src, n)");
    FAIL("no throw");
  } catch (const strata::error& e) {
    const std::string what = e.what();
    CHECK(what.find("cudaMemcpy(dst, src, n)") != std::string::npos);
    CHECK(what.find("test_kernels.cu") != std::string::npos);
  }
  try {
    STRATA_CHECK(CUBLAS_STATUS_INVALID_VALUE);
    FAIL("no throw");
  } catch (const strata::error& e) {
    CHECK(std::string(e.what()).find("CUBLAS_STATUS_INVALID_VALUE") != std::string::npos);
  }
  CHECK_NOTHROW(sc::check(cudaSuccess));
  sc::set_sync_after_launch(true);
  CHECK(sc::sync_after_launch());
  sc::set_sync_after_launch(false);
}

namespace {
struct bags {
  std::vector<std::uint64_t> keys;
  std::vector<std::uint64_t> offsets;
};
/// Random CSR bags (some empty), keys < rows with many duplicates.
bags random_bags(std::mt19937_64& gen, std::size_t count, std::uint64_t rows) {
  bags b;
  b.offsets.push_back(0);
  std::uniform_int_distribution<int> len(0, 6);
  std::uniform_int_distribution<std::uint64_t> key(0, rows - 1);
  for (std::size_t i = 0; i < count; ++i) {
    const int l = len(gen);
    for (int j = 0; j < l; ++j)
      b.keys.push_back(key(gen));
    b.offsets.push_back(b.keys.size());
  }
  return b;
}
}  // namespace

TEST_CASE("cuda: pooled gather (sum, mean) equals embedding::pool on the same table", "[cuda]") {
  if (skip_without_gpu()) return;
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  sc::stream s;
  for (const std::size_t dim : {1u, 16u, 37u, 64u}) {
    const std::uint64_t rows = 300;
    sc::local<optim::sgd> table({{"t", rows, dim}}, s, {}, embedding::uniform_init{seed});
    const auto weights = cuda_test::initial_weights(rows, dim, seed);
    cuda_test::require_bits_equal(table.download_weights(0), weights);
    const bags b = random_bags(gen, 200, rows);
    sc::device_buffer<std::uint64_t> keys(std::span<const std::uint64_t>(b.keys), s);
    sc::device_buffer<std::uint64_t> offsets(std::span<const std::uint64_t>(b.offsets), s);
    for (const bool mean : {false, true}) {
      auto out = cuda_test::poisoned(200 * dim, s);
      table.pooled_forward(0, keys.data(), offsets.data(), 200,
                           mean ? sc::pooling::mean : sc::pooling::sum, out.data());
      table.check_keys();
      cuda_test::require_close(out.download(),
                               cuda_test::pooled(weights, dim, b.keys, b.offsets, mean));
    }
  }
}

TEST_CASE("cuda: a key >= rows in pooled_forward raises out_of_range naming the table", "[cuda]") {
  if (skip_without_gpu()) return;
  sc::stream s;
  sc::local<optim::sgd> table({{"users", 10, 4}, {"items", 50, 4}}, s);
  const std::vector<std::uint64_t> k{1, 10, 3}, o{0, 2, 3};
  sc::device_buffer<std::uint64_t> keys(std::span<const std::uint64_t>(k), s);
  sc::device_buffer<std::uint64_t> offsets(std::span<const std::uint64_t>(o), s);
  auto out = cuda_test::poisoned(8, s);
  table.pooled_forward(0, keys.data(), offsets.data(), 2, sc::pooling::sum, out.data());
  // A later forward of another table with good keys must not take the blame.
  table.pooled_forward(1, keys.data(), offsets.data(), 2, sc::pooling::sum, out.data());
  try {
    table.check_keys();
    FAIL("no throw");
  } catch (const strata::error& e) {
    CHECK(e.code() == errc::out_of_range);
    CHECK(std::string(e.what()).find("users") != std::string::npos);
    CHECK(std::string(e.what()).find("items") == std::string::npos);
  }
  CHECK_NOTHROW(table.check_keys());  // the flag was cleared
  CHECK_THROWS_AS(
      table.pooled_forward(3, keys.data(), offsets.data(), 2, sc::pooling::sum, out.data()),
      strata::error);
}

namespace {
template <class O>
void check_optimizer(const O& opt) {
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(O::name, seed);
  std::mt19937_64 gen(seed);
  sc::stream s;
  for (const std::size_t dim : {8u, 33u, 64u}) {
    CAPTURE(dim);
    const std::uint64_t rows = 500;
    std::vector<std::vector<std::uint64_t>> keys;
    std::vector<std::vector<float>> grads;
    std::uniform_int_distribution<std::uint64_t> key(0, 199);  // many duplicates
    for (int step = 0; step < 3; ++step) {
      std::vector<std::uint64_t> k(1000);
      for (auto& x : k)
        x = key(gen);
      keys.push_back(k);
      grads.push_back(cuda_test::random_floats(gen, k.size() * dim));
    }
    const auto want = cuda_test::local_updates(opt, rows, dim, seed, keys, grads);
    std::vector<float> first_weights, first_state;
    for (int run = 0; run < 2; ++run) {
      sc::local<O> table({{"t", rows, dim}}, s, opt, embedding::uniform_init{seed});
      for (std::size_t step = 0; step < keys.size(); ++step) {
        sc::device_buffer<std::uint64_t> k(std::span<const std::uint64_t>(keys[step]), s);
        sc::device_buffer<float> g(std::span<const float>(grads[step]), s);
        table.apply_gradients(0, k.data(), g.data(), keys[step].size());
      }
      const auto w = table.download_weights(0);
      const auto st = table.download_state(0);
      cuda_test::require_close(w, want.weights);
      cuda_test::require_close(st, want.state);
      if (run == 0) {
        first_weights = w;
        first_state = st;
      } else {  // bitwise deterministic
        cuda_test::require_bits_equal(w, first_weights);
        cuda_test::require_bits_equal(st, first_state);
      }
    }
  }
}
}  // namespace

TEST_CASE("cuda: sparse update (sort + run-length + ordered sum) equals local::apply_gradients",
          "[cuda]") {
  if (skip_without_gpu()) return;
  SECTION("sgd") {
    check_optimizer(optim::sgd{.lr = 0.1f});
  }
  SECTION("adagrad") {
    check_optimizer(optim::adagrad{.lr = 0.05f, .initial_accumulator = 0.1f});
  }
  SECTION("adam") {
    check_optimizer(optim::adam{.lr = 0.01f});
  }
  SECTION("ftrl") {
    check_optimizer(optim::ftrl{.alpha = 0.1f, .l1 = 0.01f, .l2 = 0.001f});
  }
}

TEST_CASE("cuda: sparse_update keeps unique keys and ordered sums of duplicate rows", "[cuda]") {
  if (skip_without_gpu()) return;
  sc::stream s;
  const std::vector<std::uint64_t> k{5, 2, 5, 9, 2, 5};
  std::vector<float> g(k.size() * 2);
  std::iota(g.begin(), g.end(), 1.0f);
  g[0] = -0.0f;  // first occurrence copied: -0 stays -0 as on the CPU
  g[1] = -0.0f;
  sc::device_buffer<std::uint64_t> keys(std::span<const std::uint64_t>(k), s);
  sc::device_buffer<float> grads(std::span<const float>(g), s);
  sc::device_buffer<float> w(20, s), st(1, s);
  w.fill_bytes(0);
  sc::sparse_update up(s);
  up.apply(optim::sgd{.lr = 1.0f}, keys.data(), grads.data(), k.size(), 2, 10, w.data(), st.data(),
           true);
  REQUIRE(up.unique_count() == 3);
  std::vector<std::uint64_t> uk(3);
  std::vector<float> sums(6);
  STRATA_CHECK(cudaMemcpy(uk.data(), up.unique_keys(), 3 * 8, cudaMemcpyDeviceToHost));
  STRATA_CHECK(cudaMemcpy(sums.data(), up.summed_grads(), 6 * 4, cudaMemcpyDeviceToHost));
  CHECK(uk == std::vector<std::uint64_t>{2, 5, 9});
  // key 2: rows 1, 4; key 5: rows 0, 2, 5; key 9: row 3.
  CHECK(sums == std::vector<float>{3 + 9, 4 + 10, -0.0f + 5 + 11, -0.0f + 6 + 12, 7, 8});
}

TEST_CASE("cuda: pooled_backward equals unpool + local::apply_gradients", "[cuda]") {
  if (skip_without_gpu()) return;
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  sc::stream s;
  const std::size_t dim = 16, nbags = 300;
  const std::uint64_t rows = 100;
  for (const bool mean : {false, true}) {
    const bags b = random_bags(gen, nbags, rows);
    const auto d_out = cuda_test::random_floats(gen, nbags * dim);
    const auto key_grads = cuda_test::unpooled(d_out, dim, b.offsets, mean);
    const optim::adagrad opt{.lr = 0.1f};
    const auto want = cuda_test::local_updates(opt, rows, dim, seed, {b.keys}, {key_grads});
    sc::local<optim::adagrad> table({{"t", rows, dim}}, s, opt, embedding::uniform_init{seed});
    sc::device_buffer<std::uint64_t> keys(std::span<const std::uint64_t>(b.keys), s);
    sc::device_buffer<std::uint64_t> offsets(std::span<const std::uint64_t>(b.offsets), s);
    sc::device_buffer<float> dd(std::span<const float>(d_out), s);
    auto kg = cuda_test::poisoned(b.keys.size() * dim, s);
    sc::unpool(dd.data(), offsets.data(), nbags, dim, b.keys.size(),
               mean ? sc::pooling::mean : sc::pooling::sum, kg.data(), s);
    cuda_test::require_bits_equal(kg.download(), key_grads);
    table.pooled_backward(0, keys.data(), b.keys.size(), offsets.data(), nbags,
                          mean ? sc::pooling::mean : sc::pooling::sum, dd.data());
    cuda_test::require_close(table.download_weights(0), want.weights);
    cuda_test::require_close(table.download_state(0), want.state);
  }
}

namespace {
std::vector<float> codec_input(std::mt19937_64& gen, std::size_t n) {
  auto v = cuda_test::random_floats(gen, n, -3.0f, 3.0f);
  std::uniform_real_distribution<float> u(0, 1);
  for (std::size_t i = 0; i < n; ++i) {  // special and extreme values
    const float r = u(gen);
    if (r < 0.01f)
      v[i] = 0.0f;
    else if (r < 0.02f)
      v[i] = 1e-7f * v[i];  // half subnormals
    else if (r < 0.03f)
      v[i] = 7e4f * v[i];  // half overflow
    else if (r < 0.035f)
      v[i] = -0.0f;
  }
  return v;
}
std::vector<std::byte> bytes_of(const sc::device_buffer<std::byte>& b) {
  return b.download();
}
}  // namespace

TEST_CASE("cuda: fp16 encode gives compress::fp16's bytes; decode(+add) matches", "[cuda]") {
  if (skip_without_gpu()) return;
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  sc::stream s;
  for (const std::size_t n : {1u, 1000u, 65537u}) {
    auto x = codec_input(gen, n);
    x[0] = std::numeric_limits<float>::infinity();
    if (n > 1) x[1] = std::numeric_limits<float>::quiet_NaN();
    std::vector<std::byte> want(compress::fp16::max_encoded_bytes(n));
    compress::fp16{}.encode(x, want);
    sc::device_buffer<float> dx(std::span<const float>(x), s);
    sc::device_buffer<std::byte> enc(2 * n, s);
    enc.fill_bytes(0xab);
    sc::fp16::encode(dx.data(), n, enc.data(), s);
    REQUIRE(bytes_of(enc) == want);
    std::vector<float> dec(n);
    compress::fp16{}.decode(want, dec);
    auto out = cuda_test::poisoned(n, s);
    sc::fp16::decode(enc.data(), n, out.data(), s);
    cuda_test::require_bits_equal(out.download(), dec);
    auto acc = cuda_test::random_floats(gen, n);
    compress::fp16{}.decode_add(want, acc);
    sc::device_buffer<float> dacc(n, s);
    dacc.upload(std::span<const float>(cuda_test::random_floats(gen, 0)));
    std::mt19937_64 again(seed + n);
    auto start = cuda_test::random_floats(again, n);
    auto want_acc = start;
    compress::fp16{}.decode_add(want, want_acc);
    dacc.upload(std::span<const float>(start));
    sc::fp16::decode_add(enc.data(), n, dacc.data(), s);
    cuda_test::require_bits_equal(dacc.download(), want_acc);
  }
}

namespace {
template <std::size_t B>
void check_int8(std::mt19937_64& gen, std::uint64_t seed) {
  sc::stream s;
  for (const std::size_t n : {std::size_t{1}, B, 3 * B + 5, std::size_t{40000}}) {
    CAPTURE(B, n);
    auto x = codec_input(gen, n);
    for (std::size_t i = 0; i < std::min(n, B); ++i)
      x[i] = 0.0f;                                                     // an all-zero block
    if (n > 2 * B) x[B + 1] = std::numeric_limits<float>::infinity();  // a poisoned block
    if (n > 3 * B) {
      for (std::size_t i = 2 * B; i < 3 * B; ++i)
        x[i] *= 1e-33f;  // the double path
    }
    using cpu = compress::int8_block<B>;
    std::vector<std::byte> want(cpu::max_encoded_bytes(n));
    cpu{}.encode(x, want);
    sc::device_buffer<float> dx(std::span<const float>(x), s);
    sc::device_buffer<std::byte> enc(sc::int8_block<B>::encoded_bytes(n), s);
    enc.fill_bytes(0xab);
    sc::int8_block<B>::encode(dx.data(), n, enc.data(), s);
    REQUIRE(enc.download() == want);
    std::vector<float> dec(n);
    cpu{}.decode(want, dec);
    auto out = cuda_test::poisoned(n, s);
    sc::device_buffer<int> bad(1, s);
    bad.fill_bytes(0);
    sc::int8_block<B>::decode(enc.data(), n, out.data(), s, bad.data());
    cuda_test::require_bits_equal(out.download(), dec);
    std::mt19937_64 again(seed + n);
    auto acc = cuda_test::random_floats(again, n);
    sc::device_buffer<float> dacc(std::span<const float>(acc), s);
    cpu{}.decode_add(want, acc);
    sc::int8_block<B>::decode_add(enc.data(), n, dacc.data(), s, bad.data());
    cuda_test::require_bits_equal(dacc.download(), acc);
    CHECK(bad.download()[0] == 0);
    // A corrupt scale (−1) is flagged.
    const float minus_one = -1.0f;
    STRATA_CHECK(cudaMemcpy(enc.data(), &minus_one, 4, cudaMemcpyHostToDevice));
    sc::int8_block<B>::decode(enc.data(), n, out.data(), s, bad.data());
    CHECK(bad.download()[0] == 1);
  }
}
}  // namespace

TEST_CASE("cuda: int8_block encode gives compress::int8_block's bytes; decode(+add) matches",
          "[cuda]") {
  if (skip_without_gpu()) return;
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  check_int8<256>(gen, seed);
  check_int8<37>(gen, seed);
}

TEST_CASE("cuda: topk encode gives compress::topk's bytes (ties to the lower index)", "[cuda]") {
  if (skip_without_gpu()) return;
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  sc::stream s;
  for (const double fraction : {0.001, 0.01, 0.3, 1.0}) {
    for (const std::size_t n : {1u, 100u, 50000u}) {
      CAPTURE(fraction, n);
      auto x = cuda_test::random_floats(gen, n);
      std::uniform_int_distribution<std::size_t> pick(0, n - 1);
      for (std::size_t i = 0; i < n / 10; ++i)
        x[pick(gen)] = 0.5f;  // many ties
      x[pick(gen)] = -std::numeric_limits<float>::infinity();
      compress::topk cpu(fraction);
      std::vector<std::byte> want(cpu.max_encoded_bytes(n));
      want.resize(cpu.encode(x, want));
      sc::topk gpu(fraction, s);
      REQUIRE(gpu.kept(n) == cpu.kept(n));
      sc::device_buffer<float> dx(std::span<const float>(x), s);
      sc::device_buffer<std::byte> enc(8 * gpu.kept(n), s);
      enc.fill_bytes(0xab);
      REQUIRE(gpu.encode(dx.data(), n, enc.data()) == want.size());
      REQUIRE(enc.download() == want);
    }
  }
  CHECK_THROWS_AS(sc::topk(0.0, s), strata::error);
}

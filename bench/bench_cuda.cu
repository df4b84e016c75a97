// CUDA kernel throughput against a device-to-device cudaMemcpy of comparable bytes, same run:
// pooled gather bandwidth (FBGEMM formula), int8_block encode, sparse update rows/s vs gather
// rows/s. Results are verified first (gather vs a host sum, int8 bytes vs compress::int8_block).
// Exits 0 with a message when no GPU is present.
#include <cstdio>
#include <random>
#include <span>
#include <vector>

#include "bench_common.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/cuda/compress.cuh"
#include "strata/cuda/embedding.cuh"

namespace sc = strata::cuda;
namespace sb = strata::bench;

namespace {
/// Best seconds of `fn` over `repeats` runs, timed with CUDA events on `s` after a warm-up.
template <class Fn>
double gpu_seconds(cudaStream_t s, Fn&& fn, int repeats = 10) {
  fn();
  cudaEvent_t a, b;
  STRATA_CHECK(cudaEventCreate(&a));
  STRATA_CHECK(cudaEventCreate(&b));
  float best = 1e30f;
  for (int i = 0; i < repeats; ++i) {
    STRATA_CHECK(cudaEventRecord(a, s));
    fn();
    STRATA_CHECK(cudaEventRecord(b, s));
    STRATA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    STRATA_CHECK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms);
  }
  STRATA_CHECK(cudaEventDestroy(a));
  STRATA_CHECK(cudaEventDestroy(b));
  return best * 1e-3;
}
double memcpy_bw(cudaStream_t s, std::size_t bytes) {  // bytes moved (read + write) per second
  sc::device_buffer<std::byte> from(bytes, s), to(bytes, s);
  from.fill_bytes(1);
  const double t = gpu_seconds(s, [&] {
    STRATA_CHECK(cudaMemcpyAsync(to.data(), from.data(), bytes, cudaMemcpyDeviceToDevice, s));
  });
  return 2.0 * static_cast<double>(bytes) / t;
}
}  // namespace

int main(int argc, char** argv) try {
  const auto o = sb::options::parse(argc, argv);
  if (sc::device_count() == 0) {
    std::printf(
        "bench_cuda: no CUDA device found; nothing to measure (run scripts/gpu-check.sh "
        "on a GPU machine)\n");
    return 0;
  }
  sc::stream s;
  std::vector<sb::result> results;
  std::mt19937_64 gen(42);
  const std::uint64_t rows = o.quick ? 100000 : 4000000;
  const std::size_t dim = 64, bags = o.quick ? 4096 : 65536, pool = 32;
  const std::size_t n = bags * pool;

  // Pooled gather: bytes = bags·pool·dim·4 (rows read) + bags·dim·4 (out) + keys/offsets.
  sc::local<strata::optim::adagrad> table({{"t", rows, dim}}, s, {.lr = 0.01f});
  std::vector<std::uint64_t> keys(n), offsets(bags + 1);
  std::uniform_int_distribution<std::uint64_t> key(0, rows - 1);
  for (auto& k : keys)
    k = key(gen);
  for (std::size_t b = 0; b <= bags; ++b)
    offsets[b] = b * pool;
  sc::device_buffer<std::uint64_t> dk(std::span<const std::uint64_t>(keys), s),
      doff(std::span<const std::uint64_t>(offsets), s);
  sc::device_buffer<float> out(bags * dim, s);
  {  // verify bag 0 against a host sum
    table.pooled_forward(0, dk.data(), doff.data(), bags, sc::pooling::sum, out.data());
    table.check_keys();
    const auto w = table.download_weights(0);
    const auto got = out.download();
    for (std::size_t c = 0; c < dim; ++c) {
      float want = 0.0f;
      for (std::size_t i = 0; i < pool; ++i)
        want += w[keys[i] * dim + c];
      if (std::fabs(got[c] - want) > 1e-5f * (std::fabs(want) + 1.0f))
        strata::fail(strata::errc::internal, "bench_cuda: pooled gather gives a wrong sum");
    }
  }
  const double gather_bytes =
      static_cast<double>(n * dim * 4 + bags * dim * 4 + n * 8 + (bags + 1) * 8);
  const double tg = gpu_seconds(s, [&] {
    table.pooled_forward(0, dk.data(), doff.data(), bags, sc::pooling::sum, out.data());
  });
  const double copy = memcpy_bw(s, static_cast<std::size_t>(gather_bytes / 2));
  results.push_back({"pooled gather (dim 64, pool 32) bandwidth", gather_bytes / tg, "B/s", copy,
                     gather_bytes / tg / copy});

  // int8 encode: reads 4n bytes, writes ~n.
  const std::size_t m = o.quick ? (1u << 20) : (1u << 26);
  std::vector<float> x(m);
  std::normal_distribution<float> normal;
  for (auto& v : x)
    v = normal(gen);
  sc::device_buffer<float> dx(std::span<const float>(x), s);
  sc::device_buffer<std::byte> enc(sc::int8_block<256>::encoded_bytes(m), s);
  sc::int8_block<256>::encode(dx.data(), m, enc.data(), s);
  {
    std::vector<std::byte> want(strata::compress::int8_block<256>::max_encoded_bytes(m));
    strata::compress::int8_block<256>{}.encode(x, want);
    if (enc.download() != want)
      strata::fail(strata::errc::internal, "bench_cuda: int8 encode bytes differ from the CPU");
  }
  const double enc_bytes = static_cast<double>(m * 4 + enc.bytes());
  const double te =
      gpu_seconds(s, [&] { sc::int8_block<256>::encode(dx.data(), m, enc.data(), s); });
  const double copy2 = memcpy_bw(s, static_cast<std::size_t>(enc_bytes / 2));
  results.push_back(
      {"int8_block<256> encode bandwidth", enc_bytes / te, "B/s", copy2, enc_bytes / te / copy2});

  // Sparse update rows/s (keys with duplicates, adagrad) vs pooled-gather rows/s.
  sc::device_buffer<float> grads(n * dim, s);
  grads.fill_bytes(0);
  const double tu = gpu_seconds(
      s, [&] { table.apply_gradients(0, dk.data(), grads.data(), n); }, 5);
  const double gather_rows = static_cast<double>(n) / tg, update_rows = static_cast<double>(n) / tu;
  results.push_back({"sparse update (adagrad, dim 64) rows/s vs gather", update_rows, "rows/s",
                     gather_rows, update_rows / gather_rows});
  sb::report(o, results);
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_cuda: %s\n", e.what());
  return 1;
}

/// @file bench_compress.cpp
/// Throughput of each codec's encode and decode_add, in GB/s of fp32 input, against a memcpy
/// of the same fp32 bytes timed in the same run. Every codec's output is verified first.
///
///   bench_compress [--quick] [--json PATH]      (64 MiB of floats; --quick: 4 MiB)
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "strata/compress.hpp"
#include "strata/core/rng.hpp"

using namespace strata;
using namespace strata::compress;

namespace {

/// Fails unless `decoded` is within the codec's documented error bound of `in`: identity
/// exact, fp16 2^-11 relative (2^-25 absolute below the normal range), int8_block
/// absmax/254 per block (fp32 slack 1e-4 relative), topk exact on ≤ k kept entries, 0 elsewhere.
template <class C>
void verify(const C& codec, std::span<const float> in, std::span<const float> decoded) {
  std::size_t nonzero = 0;
  double block_bound = 0;
  for (std::size_t i = 0; i < in.size(); ++i) {
    const double x = in[i], d = decoded[i];
    nonzero += d != 0 ? 1 : 0;
    double bound = 0;
    if constexpr (std::is_same_v<C, fp16>) {
      bound = std::fabs(x) * 0x1p-11 + 0x1p-25;
    } else if constexpr (std::is_same_v<C, topk>) {
      bound = d != 0 ? 0.0 : std::fabs(x);
    } else if constexpr (requires { C::block_size; }) {
      if (i % C::block_size == 0) {
        float absmax = 0;
        for (std::size_t j = i; j < std::min(in.size(), i + C::block_size); ++j)
          absmax = std::max(absmax, std::fabs(in[j]));
        block_bound = absmax / 254.0 * (1 + 1e-4);
      }
      bound = block_bound;
    }
    if (!(std::fabs(x - d) <= bound))
      fail(errc::internal, cat("bench_compress: ", C::name, " decoded value ", i, " = ", d,
                               " is off from ", x, " by more than its bound ", bound));
  }
  if constexpr (std::is_same_v<C, topk>) {
    if (nonzero > codec.kept(in.size()))
      fail(errc::internal,
           cat("bench_compress: topk kept ", nonzero, " > k = ", codec.kept(in.size())));
  }
}

template <class C>
void measure(const bench::options& o, std::string label, C codec, std::span<const float> in,
             double memcpy_rate, std::vector<bench::result>& results) {
  const std::size_t n = in.size();
  const double input_bytes = static_cast<double>(n * sizeof(float));
  std::vector<std::byte> bytes(codec.max_encoded_bytes(n));
  aligned_buffer<float> out(n), acc(n);
  const std::size_t size = codec.encode(in, bytes);
  const std::span<const std::byte> message(bytes.data(), size);
  codec.decode(message, out);
  verify(codec, in, out.span());
  codec.decode_add(message, acc);  // acc was zero: must equal decode
  for (std::size_t i = 0; i < n; ++i)
    if (acc[i] != out[i])
      fail(errc::internal, cat("bench_compress: ", label, " decode_add differs at ", i));

  const int repeats = o.quick ? 3 : 5;
  const double encode_s = bench::best_seconds([&] { codec.encode(in, bytes); }, repeats);
  const double decode_s =
      bench::best_seconds([&] { codec.decode_add(message, acc.span()); }, repeats);
  const double encode_rate = input_bytes / encode_s, decode_rate = input_bytes / decode_s;
  std::printf("# %-22s %5.2fx fewer bytes than fp32\n", label.c_str(),
              input_bytes / static_cast<double>(size));
  results.push_back(
      {"encode/" + label, encode_rate / 1e9, "GB/s", memcpy_rate / 1e9, encode_rate / memcpy_rate});
  results.push_back({"decode_add/" + label, decode_rate / 1e9, "GB/s", memcpy_rate / 1e9,
                     decode_rate / memcpy_rate});
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto o = bench::options::parse(argc, argv);
    const std::size_t n = (o.quick ? std::size_t{4} : std::size_t{64}) << 20 >> 2;  // floats
    aligned_buffer<float> in(n);
    const counter_rng rng{1, 2};
    for (std::size_t i = 0; i < n; ++i)
      in[i] = rng.uniform(i, -1.0f, 1.0f) * (1.0f + static_cast<float>(i % 1000) / 100.0f);
    const double memcpy_rate = bench::memcpy_bytes_per_second(n * sizeof(float));
    std::printf("# %zu floats (%zu MiB); memcpy %.2f GB/s\n", n, n * sizeof(float) >> 20,
                memcpy_rate / 1e9);
    std::vector<bench::result> results;
    const std::span<const float> input = in.span();
    measure(o, "identity", identity{}, input, memcpy_rate, results);
    measure(o, "fp16", fp16{}, input, memcpy_rate, results);
    measure(o, "int8_block<256>", int8_block<256>{}, input, memcpy_rate, results);
    measure(o, "topk_1%", topk(0.01), input, memcpy_rate, results);
    bench::report(o, results);
  } catch (const strata::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

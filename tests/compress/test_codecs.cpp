#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "strata/compress.hpp"
#include "strata/core/rng.hpp"

using namespace strata;
using namespace strata::compress;

namespace {
constexpr float inf = std::numeric_limits<float>::infinity();
const float qnan = std::numeric_limits<float>::quiet_NaN();

std::vector<float> random_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  const counter_rng rng{seed, 7};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = scale * rng.normal(i);
  return v;
}

template <class C>
std::vector<std::byte> encode_all(C& codec, std::span<const float> in) {
  std::vector<std::byte> bytes(codec.max_encoded_bytes(in.size()));
  bytes.resize(codec.encode(in, bytes));
  return bytes;
}

template <class C>
std::vector<float> round_trip(C& codec, std::span<const float> in) {
  const auto bytes = encode_all(codec, in);
  std::vector<float> out(in.size(), 12345.0f);
  codec.decode(bytes, out);
  return out;
}

bool same_bits(float a, float b) {
  return std::bit_cast<std::uint32_t>(a) == std::bit_cast<std::uint32_t>(b);
}
}  // namespace

TEST_CASE("identity is lossless, NaN payloads and -0 included", "[compress][identity]") {
  identity codec;
  std::vector<float> in = random_values(1000, 1);
  in[3] = -0.0f;
  in[4] = inf;
  in[5] = std::bit_cast<float>(0x7fc0'1234u);
  in[6] = std::numeric_limits<float>::denorm_min();
  const auto out = round_trip(codec, in);
  for (std::size_t i = 0; i < in.size(); ++i)
    REQUIRE(same_bits(in[i], out[i]));
  std::vector<float> acc(in.size(), 1.0f);
  codec.decode_add(encode_all(codec, in), acc);
  for (std::size_t i = 7; i < in.size(); ++i)
    REQUIRE(acc[i] == 1.0f + in[i]);
}

TEST_CASE("fp16 decodes every half exactly", "[compress][fp16]") {
  for (std::uint32_t h = 0; h < 0x10000u; ++h) {
    const auto half = static_cast<std::uint16_t>(h);
    const float f = half_to_float(half);
    const std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    const double sign = (h & 0x8000u) ? -1.0 : 1.0;
    if (exponent == 0x1f) {
      if (mantissa == 0)
        REQUIRE(f == static_cast<float>(sign * inf));
      else
        REQUIRE(std::isnan(f));
      continue;
    }
    const double expected = exponent == 0
                                ? sign * std::ldexp(static_cast<double>(mantissa), -24)
                                : sign * std::ldexp(1.0 + mantissa / 1024.0, exponent - 15);
    REQUIRE(static_cast<double>(f) == expected);
    REQUIRE(std::signbit(f) == ((h & 0x8000u) != 0));
    REQUIRE(float_to_half(f) == half);  // every half round-trips
  }
}

TEST_CASE("fp16 rounds to nearest, ties to even, at every half interval", "[compress][fp16]") {
  // Between consecutive finite halves a < b the midpoint is a float; below it rounds to a,
  // above it to b, and at it to whichever has an even mantissa.
  for (std::uint32_t h = 0; h < 0x7bffu; ++h) {
    const float a = half_to_float(static_cast<std::uint16_t>(h));
    const float b = half_to_float(static_cast<std::uint16_t>(h + 1));
    const float mid = static_cast<float>((static_cast<double>(a) + b) / 2);
    REQUIRE(static_cast<double>(mid) == (static_cast<double>(a) + b) / 2);
    REQUIRE(float_to_half(std::nextafter(mid, 0.0f)) == h);
    REQUIRE(float_to_half(std::nextafter(mid, inf)) == h + 1);
    REQUIRE(float_to_half(mid) == ((h & 1u) ? h + 1 : h));
    REQUIRE(float_to_half(-mid) == (((h & 1u) ? h + 1 : h) | 0x8000u));
  }
#if defined(__FLT16_MAX__)
  // Cross-check against the compiler's own conversion on random bit patterns.
  const counter_rng rng{3, 0};
  for (std::uint64_t i = 0; i < 200000; ++i) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(rng.bits(i)));
    if (std::isnan(x)) continue;
    const auto reference = std::bit_cast<std::uint16_t>(static_cast<_Float16>(x));
    REQUIRE(float_to_half(x) == reference);
  }
#endif
}

TEST_CASE("fp16 error bounds and special values", "[compress][fp16]") {
  fp16 codec;
  const auto in = random_values(5000, 2, 100.0f);
  const auto out = round_trip(codec, in);
  for (std::size_t i = 0; i < in.size(); ++i) {
    const float a = std::fabs(in[i]);
    if (a >= 0x1p-14f)
      REQUIRE(std::fabs(out[i] - in[i]) <= 0x1p-11f * a);
    else
      REQUIRE(std::fabs(out[i] - in[i]) <= 0x1p-25f);
  }
  CHECK(float_to_half(65504.0f) == 0x7bffu);
  CHECK(float_to_half(65519.99f) == 0x7bffu);
  CHECK(float_to_half(65520.0f) == 0x7c00u);  // overflow → inf (tie rounds up to even = inf)
  CHECK(float_to_half(-1e10f) == 0xfc00u);
  CHECK(float_to_half(inf) == 0x7c00u);
  CHECK(float_to_half(-inf) == 0xfc00u);
  CHECK(std::isnan(half_to_float(float_to_half(qnan))));
  CHECK(std::isnan(half_to_float(float_to_half(std::bit_cast<float>(0x7f80'0001u)))));  // sNaN
  CHECK(float_to_half(-0.0f) == 0x8000u);
  CHECK(float_to_half(0x1p-24f) == 0x0001u);         // smallest subnormal half
  CHECK(float_to_half(0x1p-25f) == 0x0000u);         // tie → even (zero)
  CHECK(float_to_half(0x1.000002p-25f) == 0x0001u);  // just above the tie
  CHECK(float_to_half(0x1.8p-24f) == 0x0002u);       // 1.5 ulp → tie → even (2)
  CHECK(float_to_half(1e-30f) == 0x0000u);
  CHECK(float_to_half(0x1p-14f) == 0x0400u);  // smallest normal
}

TEST_CASE("int8_block error is at most absmax/254 per block", "[compress][int8]") {
  const auto check = [](auto codec, std::size_t n, float scale) {
    constexpr std::size_t B = decltype(codec)::block_size;
    auto in = random_values(n, n + 11, scale);
    if (n > 5) in[n / 2] *= 40.0f;  // one outlier: its block gets a coarser scale
    const auto bytes = encode_all(codec, in);
    REQUIRE(bytes.size() == 4 * ((n + B - 1) / B) + n);
    std::vector<float> out(n, 99.0f);
    codec.decode(bytes, out);
    for (std::size_t begin = 0; begin < n; begin += B) {
      const std::size_t end = std::min(n, begin + B);
      float absmax = 0;
      for (std::size_t i = begin; i < end; ++i)
        absmax = std::max(absmax, std::fabs(in[i]));
      // A subnormal scale (absmax < 127 * 2^-126) is rounded to a multiple of denorm_min,
      // which 127 levels can magnify to 63.5 denorm_min.
      const double bound =
          absmax / 254.0 * (1 + 1e-4) + 65.0 * std::numeric_limits<float>::denorm_min();
      for (std::size_t i = begin; i < end; ++i) {
        INFO("n=" << n << " i=" << i << " x=" << in[i] << " absmax=" << absmax);
        REQUIRE(std::fabs(static_cast<double>(out[i]) - in[i]) <= bound);
      }
    }
    std::vector<float> acc(n, 0.5f);
    codec.decode_add(bytes, acc);
    for (std::size_t i = 0; i < n; ++i)
      REQUIRE(acc[i] == Approx(0.5f + out[i]).margin(1e-6 * scale));
  };
  for (std::size_t n : {0u, 1u, 2u, 255u, 256u, 257u, 1000u, 4099u}) {
    check(int8_block<256>{}, n, 1.0f);
    check(int8_block<256>{}, n, 3e4f);
    check(int8_block<7>{}, n, 1.0f);
    check(int8_block<1>{}, n, 1.0f);
    check(int8_block<256>{}, n, 1e-33f);  // tiny blocks take the double-precision path
    check(int8_block<256>{}, n, 1e-42f);  // subnormal inputs
  }
}

TEST_CASE("int8_block edge cases: zeros, exact levels, non-finite blocks", "[compress][int8]") {
  int8_block<4> codec;
  std::vector<float> zeros(10, 0.0f);
  zeros[1] = -0.0f;
  for (float v : round_trip(codec, zeros))
    REQUIRE(v == 0.0f);
  // Multiples of absmax/127 are represented exactly (up to the scale's own rounding).
  std::vector<float> levels = {127.0f, -127.0f, 64.0f, -1.0f};
  const auto out = round_trip(codec, levels);
  for (std::size_t i = 0; i < levels.size(); ++i)
    CHECK(out[i] == levels[i]);
  // inf or NaN poisons only its own block.
  std::vector<float> in = {1, 2, 3, 4, 5, inf, 7, 8, 9, qnan, 11, 12, 13};
  const auto got = round_trip(codec, in);
  for (std::size_t i = 0; i < 4; ++i)
    CHECK(got[i] == Approx(in[i]).epsilon(0.01));
  for (std::size_t i = 4; i < 12; ++i)
    CHECK(std::isnan(got[i]));
  CHECK(got[12] == Approx(13.0f).epsilon(0.001));
}

TEST_CASE("topk keeps exactly the k largest magnitudes", "[compress][topk]") {
  for (double fraction : {0.01, 0.1, 0.5, 1.0}) {
    for (std::size_t n : {0u, 1u, 2u, 99u, 100u, 101u, 5000u}) {
      topk codec(fraction);
      auto in = random_values(n, n * 3 + 1);
      for (std::size_t i = 0; i < n; i += 7)
        in[i] = (i % 2 ? -1.0f : 1.0f) * 0.75f;  // many exact ties in magnitude
      const std::size_t k = codec.kept(n);
      CHECK(k == (n == 0 ? 0 : static_cast<std::size_t>(std::ceil(fraction * n - 1e-9))));
      const auto bytes = encode_all(codec, in);
      REQUIRE(bytes.size() == 8 * k);
      // Reference: full sort by (|x| desc, index asc), keep the first k.
      std::vector<std::size_t> order(n);
      std::iota(order.begin(), order.end(), 0);
      std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
        const float ma = std::fabs(in[a]), mb = std::fabs(in[b]);
        return ma != mb ? ma > mb : a < b;
      });
      std::vector<char> keep(n, 0);
      for (std::size_t j = 0; j < k; ++j)
        keep[order[j]] = 1;
      std::vector<float> out(n, 42.0f);
      codec.decode(bytes, out);
      std::vector<float> acc(n, 1.0f);
      codec.decode_add(bytes, acc);
      for (std::size_t i = 0; i < n; ++i) {
        INFO("fraction=" << fraction << " n=" << n << " i=" << i);
        REQUIRE(same_bits(out[i], keep[i] ? in[i] : 0.0f));
        REQUIRE(acc[i] == (keep[i] ? 1.0f + in[i] : 1.0f));
      }
    }
  }
}

TEST_CASE("topk keeps non-finite values first and breaks ties by index", "[compress][topk]") {
  topk codec(0.3);  // k = 3 of 10
  std::vector<float> in(10, 1.0f);
  in[8] = qnan;
  in[2] = -inf;
  const auto out = round_trip(codec, in);
  CHECK(std::isnan(out[8]));
  CHECK(out[2] == -inf);
  CHECK(out[0] == 1.0f);  // the lowest index among the ties
  for (std::size_t i : {1u, 3u, 4u, 5u, 6u, 7u, 9u})
    CHECK(out[i] == 0.0f);
}

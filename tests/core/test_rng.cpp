#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <thread>
#include <vector>

#include "strata/core/rng.hpp"

using namespace strata;

TEST_CASE("philox4x32-10 matches the Random123 known-answer vectors", "[core][rng]") {
  using block = std::array<std::uint32_t, 4>;
  // kat_vectors from Random123 (Salmon et al., SC'11).
  STATIC_REQUIRE(philox4x32({0, 0, 0, 0}, {0, 0}) ==
                 block{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u});
  REQUIRE(philox4x32({0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
                     {0xffffffffu, 0xffffffffu}) ==
          block{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu});
  REQUIRE(philox4x32({0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
                     {0xa4093822u, 0x299f31d0u}) ==
          block{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
}

TEST_CASE("counter_rng maps (seed, stream, index) onto philox key and counter", "[core][rng]") {
  REQUIRE(counter_rng{0, 0}.block(0) == philox4x32({0, 0, 0, 0}, {0, 0}));
  const counter_rng r{0x299f31d0a4093822ull, 0x0370734413198a2eull};
  REQUIRE(r.block(0x85a308d3243f6a88ull) ==
          std::array<std::uint32_t, 4>{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u});
  REQUIRE(r.bits(0x85a308d3243f6a88ull) == 0xd16cfe0994fdccebull);
  // Seed, stream and index each change the value.
  const counter_rng a{1, 2};
  REQUIRE(a.bits(3) != counter_rng{2, 2}.bits(3));
  REQUIRE(a.bits(3) != counter_rng{1, 3}.bits(3));
  REQUIRE(a.bits(3) != a.bits(4));
  REQUIRE(a.bits(3) == counter_rng{1, 2}.bits(3));
}

TEST_CASE("the same (seed, stream, index) gives the same value on any thread", "[core][rng]") {
  constexpr std::size_t n = 4096;
  const auto draw = [](std::vector<std::uint64_t>& out, bool reverse) {
    const counter_rng rng{42, 7};
    out.resize(n);
    for (std::size_t k = 0; k < n; ++k) {
      const std::size_t i = reverse ? n - 1 - k : k;
      out[i] = rng.bits(i) ^ std::bit_cast<std::uint32_t>(rng.uniform(i)) ^
               std::bit_cast<std::uint32_t>(rng.normal(i));
    }
  };
  std::vector<std::uint64_t> here, there, again;
  draw(here, false);
  std::thread t1([&] { draw(there, true); });
  std::thread t2([&] { draw(again, false); });
  t1.join();
  t2.join();
  REQUIRE(here == there);
  REQUIRE(here == again);
}

TEST_CASE("uniform has the mean, variance and spread of U[0,1)", "[core][rng]") {
  constexpr int n = 200000;
  const counter_rng rng{123, 4};
  double sum = 0, sum2 = 0;
  std::array<int, 16> bins{};
  float lo = 1, hi = 0;
  for (int i = 0; i < n; ++i) {
    const float u = rng.uniform(static_cast<std::uint64_t>(i));
    REQUIRE(u >= 0.0f);
    REQUIRE(u < 1.0f);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    sum += u;
    sum2 += double(u) * u;
    ++bins[static_cast<std::size_t>(u * 16)];
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  // 6 standard errors: sd(mean) = sqrt(1/12/n); sd(var) = sqrt((1/80 - 1/144)/n).
  CHECK(std::abs(mean - 0.5) < 6 * std::sqrt(1.0 / 12 / n));
  CHECK(std::abs(var - 1.0 / 12) < 6 * std::sqrt((1.0 / 80 - 1.0 / 144) / n));
  CHECK(lo < 1e-3f);
  CHECK(hi > 1 - 1e-3f);
  const double expected = n / 16.0, sd = std::sqrt(expected * (1 - 1.0 / 16));
  for (int count : bins)
    CHECK(std::abs(count - expected) < 6 * sd);

  double dsum = 0;
  for (int i = 0; i < n; ++i) {
    const double u = rng.uniform_double(static_cast<std::uint64_t>(i));
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    dsum += u;
  }
  CHECK(std::abs(dsum / n - 0.5) < 6 * std::sqrt(1.0 / 12 / n));
  for (int i = 0; i < 1000; ++i) {
    const float v = rng.uniform(static_cast<std::uint64_t>(i), -3.0f, 5.0f);
    REQUIRE(v >= -3.0f);
    REQUIRE(v < 5.0f);
  }
}

TEST_CASE("normal has mean 0, variance 1 and normal tails", "[core][rng]") {
  constexpr int n = 200000;
  const counter_rng rng{9, 1};
  double sum = 0, sum2 = 0, sum4 = 0;
  int beyond2 = 0;
  for (int i = 0; i < n; ++i) {
    const double z = rng.normal(static_cast<std::uint64_t>(i));
    REQUIRE(std::isfinite(z));
    sum += z;
    sum2 += z * z;
    sum4 += z * z * z * z;
    beyond2 += std::abs(z) > 2 ? 1 : 0;
  }
  const double mean = sum / n, var = sum2 / n - mean * mean;
  CHECK(std::abs(mean) < 6 / std::sqrt(double(n)));
  CHECK(std::abs(var - 1) < 6 * std::sqrt(2.0 / n));
  CHECK(std::abs(sum4 / n - 3) < 6 * std::sqrt(96.0 / n));  // 4th moment: E z^4 = 3, var 96
  const double p2 = 0.0455003, sd = std::sqrt(p2 * (1 - p2) / n);
  CHECK(std::abs(double(beyond2) / n - p2) < 6 * sd);
}

TEST_CASE("below() stays in range and is uniform", "[core][rng]") {
  const counter_rng rng{5, 5};
  for (std::uint64_t bound : {1ull, 2ull, 3ull, 7ull, 1000ull, (1ull << 63) + 1, ~0ull})
    for (std::uint64_t i = 0; i < 2000; ++i)
      REQUIRE(rng.below(i, bound) < bound);
  for (std::uint64_t i = 0; i < 100; ++i)
    REQUIRE(rng.below(i, 1) == 0);
  constexpr int n = 60000;
  std::array<int, 3> counts{};
  for (int i = 0; i < n; ++i)
    ++counts[rng.below(static_cast<std::uint64_t>(i), 3)];
  const double expected = n / 3.0, sd = std::sqrt(expected * 2 / 3);
  for (int c : counts)
    CHECK(std::abs(c - expected) < 6 * sd);
}

TEST_CASE("shuffle is a deterministic permutation", "[core][rng]") {
  std::vector<int> a(100);
  std::iota(a.begin(), a.end(), 0);
  auto b = a, c = a;
  shuffle(std::span(a), counter_rng{1, 2});
  shuffle(std::span(b), counter_rng{1, 2});
  shuffle(std::span(c), counter_rng{1, 3});
  REQUIRE(a == b);
  REQUIRE(a != c);
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  REQUIRE(sorted == identity);
  REQUIRE(a != identity);

  // Every position is reachable: over many streams element 0 lands everywhere in a size-5 array.
  std::array<int, 5> where{};
  for (std::uint64_t s = 0; s < 5000; ++s) {
    std::array<int, 5> v{0, 1, 2, 3, 4};
    shuffle(std::span(v), counter_rng{7, s});
    ++where[static_cast<std::size_t>(std::find(v.begin(), v.end(), 0) - v.begin())];
  }
  for (int count : where)
    CHECK(std::abs(count - 1000) < 6 * std::sqrt(1000 * 0.8));

  std::vector<int> empty, one{9};
  shuffle(std::span(empty), counter_rng{});
  shuffle(std::span(one), counter_rng{});
  REQUIRE(one == std::vector<int>{9});
}

TEST_CASE("mix_ids separates its inputs", "[core][rng]") {
  STATIC_REQUIRE(mix_ids(1, 2) == mix_ids(1, 2));
  REQUIRE(mix_ids(1, 2) != mix_ids(2, 1));
  REQUIRE(mix_ids(0, 0) != mix_ids(0, 1));
  std::vector<std::uint64_t> seen;
  for (std::uint64_t a = 0; a < 30; ++a)
    for (std::uint64_t b = 0; b < 30; ++b)
      seen.push_back(mix_ids(a, b));
  std::sort(seen.begin(), seen.end());
  REQUIRE(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
}

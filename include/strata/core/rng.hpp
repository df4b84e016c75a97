/// @file rng.hpp
/// Counter-based random numbers (Philox4x32-10): the value at (seed, stream, index) is a pure
/// function of those three numbers, so every rank, thread and placement draws the same value
/// for the same id without sharing state.
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <utility>

namespace strata {

namespace detail {
__extension__ using uint128 = unsigned __int128;  // GCC/Clang extension, silenced for -Wpedantic
}  // namespace detail

/// Philox4x32-10 (Salmon et al., SC'11): 4×32 random bits per (key, counter).
/// Pure function; thread-safe; about 10 multiply rounds per 128 bits. The rounds work on
/// scalars, not on the arrays: unoptimised builds (-O0, the sanitizer tests) would otherwise
/// call std::array's operator[] and copy a temporary array twelve times per round — 10× slower
/// there, the same code at -O2.
constexpr std::array<std::uint32_t, 4> philox4x32(std::array<std::uint32_t, 4> counter,
                                                  std::array<std::uint32_t, 2> key) noexcept {
  constexpr std::uint32_t m0 = 0xD2511F53u, m1 = 0xCD9E8D57u;
  constexpr std::uint32_t w0 = 0x9E3779B9u, w1 = 0xBB67AE85u;
  std::uint32_t c0 = counter[0], c1 = counter[1], c2 = counter[2], c3 = counter[3];
  std::uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const std::uint64_t p0 = std::uint64_t{m0} * c0;
    const std::uint64_t p1 = std::uint64_t{m1} * c2;
    const std::uint32_t next0 = static_cast<std::uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const std::uint32_t next2 = static_cast<std::uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<std::uint32_t>(p1);
    c3 = static_cast<std::uint32_t>(p0);
    c0 = next0;
    c2 = next2;
    k0 += w0;
    k1 += w1;
  }
  return {c0, c1, c2, c3};
}

/// Mixes several 64-bit ids into one (splitmix64 finaliser chain); used to derive stream ids
/// such as (table, key) → stream.
constexpr std::uint64_t mix_ids(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t z = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/// Random numbers keyed by (seed, stream, index). `counter_rng{seed, stream}.uniform(i)` is the
/// same on every rank. Value type; all members const and thread-safe.
struct counter_rng {
  std::uint64_t seed = 0;
  std::uint64_t stream = 0;

  /// 128 random bits for `index`.
  [[nodiscard]] constexpr std::array<std::uint32_t, 4> block(std::uint64_t index) const noexcept {
    return philox4x32(
        {static_cast<std::uint32_t>(index), static_cast<std::uint32_t>(index >> 32),
         static_cast<std::uint32_t>(stream), static_cast<std::uint32_t>(stream >> 32)},
        {static_cast<std::uint32_t>(seed), static_cast<std::uint32_t>(seed >> 32)});
  }
  /// 64 random bits for `index`.
  [[nodiscard]] constexpr std::uint64_t bits(std::uint64_t index) const noexcept {
    const auto b = block(index);
    return (std::uint64_t{b[0]} << 32) | b[1];
  }
  /// Uniform float in [0, 1) (24 random bits).
  [[nodiscard]] constexpr float uniform(std::uint64_t index) const noexcept {
    return static_cast<float>(block(index)[0] >> 8) * 0x1.0p-24f;
  }
  /// Uniform double in [0, 1) (53 random bits).
  [[nodiscard]] constexpr double uniform_double(std::uint64_t index) const noexcept {
    return static_cast<double>(bits(index) >> 11) * 0x1.0p-53;
  }
  /// Uniform float in [lo, hi).
  [[nodiscard]] constexpr float uniform(std::uint64_t index, float lo, float hi) const noexcept {
    return lo + (hi - lo) * uniform(index);
  }
  /// Standard normal (Box–Muller on one 128-bit block).
  [[nodiscard]] float normal(std::uint64_t index) const noexcept {
    const auto b = block(index);
    const double u1 = (static_cast<double>(b[0]) + 1.0) * 0x1.0p-32;  // (0, 1]
    const double u2 = static_cast<double>(b[1]) * 0x1.0p-32;
    return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) *
                              std::cos(2.0 * std::numbers::pi * u2));
  }
  /// Uniform integer in [0, bound) (bound > 0), by Lemire's multiply-shift (bias < 2^-32).
  [[nodiscard]] constexpr std::uint64_t below(std::uint64_t index,
                                              std::uint64_t bound) const noexcept {
    return static_cast<std::uint64_t>((static_cast<detail::uint128>(bits(index)) * bound) >> 64);
  }
};

/// Fisher–Yates shuffle driven by a counter_rng: the permutation depends only on
/// (rng.seed, rng.stream, size), never on the standard library's implementation.
template <class T, std::size_t Extent>
void shuffle(std::span<T, Extent> values, counter_rng rng) noexcept {
  for (std::size_t i = values.size(); i > 1; --i) {
    const std::size_t j = rng.below(i, i);
    using std::swap;
    swap(values[i - 1], values[j]);
  }
}

}  // namespace strata

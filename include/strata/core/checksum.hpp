/// @file checksum.hpp
/// `fast_checksum`: a 64-bit checksum of a byte range at memory speed (four independent
/// multiply-rotate lanes over 32-byte blocks, XXH64's round), for messages in flight. Not
/// cryptographic; every change confined to one aligned 8-byte word (any flipped bit of it) is
/// always detected, since each round is a bijection of its lane for a fixed state.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace strata {

namespace detail {
inline constexpr std::uint64_t checksum_p1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t checksum_p2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t checksum_p3 = 0x165667B19E3779F9ull;
[[nodiscard]] inline std::uint64_t checksum_round(std::uint64_t lane, std::uint64_t word) noexcept {
  return std::rotl(lane + word * checksum_p2, 31) * checksum_p1;
}
[[nodiscard]] inline std::uint64_t checksum_word(const std::byte* p) noexcept {
  std::uint64_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}
}  // namespace detail

/// The checksum of `bytes` (its length included). Cost: about one pass at memory bandwidth.
[[nodiscard]] inline std::uint64_t fast_checksum(std::span<const std::byte> bytes) noexcept {
  using namespace detail;
  const std::byte* p = bytes.data();
  std::size_t left = bytes.size();
  std::uint64_t a = checksum_p1 + checksum_p2, b = checksum_p2, c = 0, d = 0 - checksum_p1;
  for (; left >= 32; left -= 32, p += 32) {
    a = checksum_round(a, checksum_word(p));
    b = checksum_round(b, checksum_word(p + 8));
    c = checksum_round(c, checksum_word(p + 16));
    d = checksum_round(d, checksum_word(p + 24));
  }
  std::uint64_t h = std::rotl(a, 1) + std::rotl(b, 7) + std::rotl(c, 12) + std::rotl(d, 18);
  h += bytes.size() * checksum_p3;
  for (; left >= 8; left -= 8, p += 8)
    h = std::rotl(h ^ checksum_round(0, checksum_word(p)), 27) * checksum_p1 + checksum_p3;
  for (; left > 0; --left, ++p)
    h = std::rotl(h ^ (std::to_integer<std::uint64_t>(*p) * checksum_p3), 11) * checksum_p1;
  h ^= h >> 33;
  h *= checksum_p2;
  h ^= h >> 29;
  h *= checksum_p3;
  h ^= h >> 32;
  return h;
}

}  // namespace strata

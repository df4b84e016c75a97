#include <catch2/catch.hpp>

#include <cstddef>
#include <vector>

#include "strata/core/checksum.hpp"

TEST_CASE("fast_checksum sees every flipped bit, the length and the order", "[core][checksum]") {
  for (std::size_t n : {0u, 1u, 7u, 8u, 31u, 32u, 33u, 100u, 1000u}) {
    INFO("bytes " << n);
    std::vector<std::byte> bytes(n);
    for (std::size_t i = 0; i < n; ++i)
      bytes[i] = static_cast<std::byte>((i * 37 + 11) & 0xFF);
    const std::uint64_t sum = strata::fast_checksum(bytes);
    REQUIRE(strata::fast_checksum(bytes) == sum);  // a function of the bytes alone
    for (std::size_t i = 0; i < n; ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        bytes[i] ^= static_cast<std::byte>(1 << bit);
        REQUIRE(strata::fast_checksum(bytes) != sum);
        bytes[i] ^= static_cast<std::byte>(1 << bit);
      }
    }
    if (n >= 16) {  // two 8-byte words swapped
      std::vector<std::byte> swapped(bytes);
      std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
      REQUIRE(strata::fast_checksum(swapped) != sum);
    }
    bytes.push_back(std::byte{0});  // a trailing zero byte changes the length
    REQUIRE(strata::fast_checksum(bytes) != sum);
  }
}

#include <catch2/catch.hpp>

#include <cstddef>
#include <span>

#include "strata/compress.hpp"

using namespace strata::compress;

namespace {
/// Models the contract: name, bound, encode, decode, decode_add.
struct halves_nothing {
  static constexpr const char* name = "halves_nothing";
  static std::size_t max_encoded_bytes(std::size_t n) { return n * 4; }
  std::size_t encode(std::span<const float>, std::span<std::byte>) { return 0; }
  void decode(std::span<const std::byte>, std::span<float>) const {}
  void decode_add(std::span<const std::byte>, std::span<float>) const {}
};
/// Misses decode_add (cannot be the receive side of a reduce).
struct no_decode_add {
  static constexpr const char* name = "no_decode_add";
  static std::size_t max_encoded_bytes(std::size_t n) { return n * 4; }
  std::size_t encode(std::span<const float>, std::span<std::byte>) { return 0; }
  void decode(std::span<const std::byte>, std::span<float>) const {}
};
/// Has every member but no name (fails the cheap first check).
struct no_name {
  static std::size_t max_encoded_bytes(std::size_t n) { return n * 4; }
  std::size_t encode(std::span<const float>, std::span<std::byte>) { return 0; }
  void decode(std::span<const std::byte>, std::span<float>) const {}
  void decode_add(std::span<const std::byte>, std::span<float>) const {}
};
}  // namespace

TEST_CASE("compressor concept: models and non-models", "[compress][concepts]") {
  STATIC_REQUIRE(compressor<halves_nothing>);
  STATIC_REQUIRE_FALSE(compressor<no_decode_add>);
  STATIC_REQUIRE_FALSE(compressor<no_name>);
  STATIC_REQUIRE_FALSE(compressor<int>);
  STATIC_REQUIRE_FALSE(fixed_size_compressor<halves_nothing>);
  STATIC_REQUIRE_FALSE(positional_compressor<halves_nothing>);

  STATIC_REQUIRE(fixed_size_compressor<identity>);
  STATIC_REQUIRE(fixed_size_compressor<fp16>);
  STATIC_REQUIRE(fixed_size_compressor<int8_block<256>>);
  STATIC_REQUIRE(fixed_size_compressor<int8_block<7>>);
  STATIC_REQUIRE(compressor<topk>);
  STATIC_REQUIRE_FALSE(fixed_size_compressor<topk>);
  STATIC_REQUIRE(positional_compressor<error_feedback<int8_block<256>>>);
  STATIC_REQUIRE(fixed_size_compressor<error_feedback<int8_block<256>>>);
  STATIC_REQUIRE(positional_compressor<error_feedback<topk>>);
  STATIC_REQUIRE_FALSE(fixed_size_compressor<error_feedback<topk>>);
  STATIC_REQUIRE_FALSE(positional_compressor<int8_block<256>>);
}

TEST_CASE("wire sizes", "[compress][concepts]") {
  CHECK(identity::max_encoded_bytes(10) == 40);
  CHECK(fp16::max_encoded_bytes(10) == 20);
  CHECK(int8_block<256>::max_encoded_bytes(0) == 0);
  CHECK(int8_block<256>::max_encoded_bytes(256) == 260);
  CHECK(int8_block<256>::max_encoded_bytes(257) == 265);
  CHECK(topk(0.01).max_encoded_bytes(0) == 0);
  CHECK(topk(0.01).max_encoded_bytes(1) == 8);
  CHECK(topk(0.01).max_encoded_bytes(100) == 8);
  CHECK(topk(0.01).max_encoded_bytes(101) == 16);
  CHECK(topk(0.07).kept(100) == 7);
  CHECK(topk(1.0).kept(13) == 13);
  CHECK_THROWS_AS(topk(0.0), strata::error);
  CHECK_THROWS_AS(topk(1.5), strata::error);
}

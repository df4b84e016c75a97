#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "strata/compress.hpp"
#include "strata/core/rng.hpp"

using namespace strata;
using namespace strata::compress;

namespace {
template <class C>
std::vector<std::byte> encode_all(C& codec, std::span<const float> in) {
  std::vector<std::byte> bytes(codec.max_encoded_bytes(in.size()));
  bytes.resize(codec.encode(in, bytes));
  return bytes;
}

std::vector<float> ramp(std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(i % 13) - 6.0f;
  return v;
}

template <class Fn>
errc code_of(Fn&& fn) {
  try {
    fn();
  } catch (const error& e) {
    return e.code();
  }
  FAIL("expected a strata::error");
  return errc::internal;
}

/// Whether every value is still the 7.0f it was filled with (one assertion per buffer, not per
/// value: Catch2's per-assertion bookkeeping made this loop most of the run under ASan).
bool untouched(const std::vector<float>& values) {
  return std::all_of(values.begin(), values.end(), [](float v) { return v == 7.0f; });
}

/// Decodes `bytes` into `n` values; on a bad_message the output must be untouched.
template <class C>
bool decode_checked(const C& codec, std::span<const std::byte> bytes, std::size_t n) {
  std::vector<float> out(n, 7.0f), acc(n, 7.0f);
  bool ok = true;
  try {
    codec.decode(bytes, out);
  } catch (const error& e) {
    REQUIRE(e.code() == errc::bad_message);
    ok = false;
    REQUIRE(untouched(out));
  }
  try {
    codec.decode_add(bytes, acc);
    REQUIRE(ok);
  } catch (const error& e) {
    REQUIRE(e.code() == errc::bad_message);
    REQUIRE_FALSE(ok);
    REQUIRE(untouched(acc));
  }
  return ok;
}

template <class C>
void fuzz(C codec, std::uint64_t seed) {
  const counter_rng rng{seed, 1};
  std::uint64_t draw = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::size_t n = rng.below(draw++, 600);
    const auto in = ramp(n);
    auto bytes = encode_all(codec, in);
    switch (rng.below(draw++, 4)) {
      case 0:  // flip random bytes of a valid message
        for (int f = 0; f < 4 && !bytes.empty(); ++f) {
          const std::size_t at = rng.below(draw++, bytes.size());
          bytes[at] = static_cast<std::byte>(rng.bits(draw++));
        }
        break;
      case 1:  // truncate or extend
        bytes.resize(rng.below(draw++, bytes.size() + 16));
        break;
      case 2: {  // pure noise of a random size
        bytes.resize(rng.below(draw++, 3 * n + 32));
        for (auto& b : bytes)
          b = static_cast<std::byte>(rng.bits(draw++));
        break;
      }
      default:  // a valid message decoded for another length
        break;
    }
    const std::size_t decode_n = rng.below(draw++, 3) == 0 ? rng.below(draw++, 700) : n;
    decode_checked(codec, bytes, decode_n);  // must throw bad_message or succeed, never crash
  }
}
}  // namespace

TEST_CASE("random bytes never crash a decoder", "[compress][malformed]") {
  fuzz(identity{}, 1);
  fuzz(fp16{}, 2);
  fuzz(int8_block<256>{}, 3);
  fuzz(int8_block<5>{}, 4);
  fuzz(topk(0.1), 5);
  fuzz(error_feedback<int8_block<16>>(1000), 6);
}

TEST_CASE("truncated and wrong-length messages are bad_message", "[compress][malformed]") {
  const auto in = ramp(300);
  const auto check_fixed = [&](auto codec) {
    const auto bytes = encode_all(codec, in);
    REQUIRE(decode_checked(codec, bytes, in.size()));
    for (std::size_t cut = 0; cut < bytes.size(); cut += 7)
      REQUIRE_FALSE(decode_checked(codec, std::span(bytes).first(cut), in.size()));
    REQUIRE_FALSE(decode_checked(codec, bytes, in.size() + 1));
    REQUIRE_FALSE(decode_checked(codec, bytes, in.size() - 1));
    auto longer = bytes;
    longer.push_back(std::byte{0});
    REQUIRE_FALSE(decode_checked(codec, longer, in.size()));
  };
  check_fixed(identity{});
  check_fixed(fp16{});
  check_fixed(int8_block<256>{});
  check_fixed(int8_block<7>{});

  topk codec(0.1);
  const auto bytes = encode_all(codec, in);
  REQUIRE(bytes.size() == 30 * 8);
  REQUIRE(decode_checked(codec, bytes, in.size()));
  for (std::size_t cut = 1; cut < bytes.size(); cut += 8)  // not a whole number of pairs
    REQUIRE_FALSE(decode_checked(codec, std::span(bytes).first(cut), in.size()));
  REQUIRE(decode_checked(codec, std::span(bytes).first(16), in.size()));  // fewer pairs is valid
}

TEST_CASE("corrupt contents are bad_message", "[compress][malformed]") {
  const auto in = ramp(40);
  SECTION("int8_block scales must be finite and non-negative") {
    int8_block<16> codec;
    auto bytes = encode_all(codec, in);
    for (float bad : {-1.0f, std::numeric_limits<float>::infinity(), -0.5e-40f}) {
      auto copy = bytes;
      std::memcpy(copy.data() + 20, &bad, sizeof bad);  // the second block's scale
      CHECK(code_of([&] {
              std::vector<float> out(in.size());
              codec.decode(copy, out);
            }) == errc::bad_message);
    }
  }
  SECTION("topk indices must be increasing and in range") {
    topk codec(0.1);
    const auto bytes = encode_all(codec, in);  // 4 pairs
    const auto with_index = [&](std::size_t pair, std::uint32_t index) {
      auto copy = bytes;
      std::memcpy(copy.data() + pair * 8, &index, sizeof index);
      return copy;
    };
    std::uint32_t first, second;
    std::memcpy(&first, bytes.data(), 4);
    std::memcpy(&second, bytes.data() + 8, 4);
    REQUIRE_FALSE(decode_checked(codec, with_index(1, first), in.size()));       // duplicate
    REQUIRE_FALSE(decode_checked(codec, with_index(0, second + 1), in.size()));  // out of order
    REQUIRE_FALSE(decode_checked(codec, with_index(3, 40), in.size()));          // == n
    REQUIRE_FALSE(decode_checked(codec, with_index(3, 0xffff'ffffu), in.size()));
    std::vector<std::byte> too_many(41 * 8);
    REQUIRE_FALSE(decode_checked(codec, too_many, in.size()));
  }
}

TEST_CASE("encode into a too-small buffer is invalid_argument", "[compress][malformed]") {
  const auto in = ramp(100);
  std::vector<std::byte> small(50);
  CHECK(code_of([&] { identity{}.encode(in, small); }) == errc::invalid_argument);
  CHECK(code_of([&] { fp16{}.encode(in, small); }) == errc::invalid_argument);
  CHECK(code_of([&] { int8_block<256>{}.encode(in, small); }) == errc::invalid_argument);
  topk codec(0.1);
  std::vector<std::byte> tiny(79);
  CHECK(code_of([&] { codec.encode(in, tiny); }) == errc::invalid_argument);
}

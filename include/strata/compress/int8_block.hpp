/// @file int8_block.hpp
/// The `int8_block<B>` codec: per block of B values one fp32 absmax scale and B int8 values
/// (≈ 3.94× fewer bytes than fp32 at B = 256).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>

#include "strata/compress/concepts.hpp"

namespace strata::compress {

/// Block-wise symmetric int8 quantisation. Wire format, per block of B values (the last block
/// may be shorter): the fp32 `scale = absmax / 127` (4 bytes), then one int8
/// `q = round_to_nearest_even(x / scale)` in [-127, 127] per value; `x ≈ q · scale`.
/// Encoded size is exact: `4 · ceil(n / B) + n` bytes.
///
/// Error: |x − decoded| ≤ scale / 2 = absmax / 254 per block (times 1 + 1e-4 for fp32 rounding
/// of 127/absmax and x·(127/absmax), plus up to 64 · 2^-149 when absmax < 127 · 2^-126 makes the
/// scale subnormal). All-zero blocks decode to exact zeros. Non-finite policy: a block holding any
/// inf or NaN is sent with a NaN scale and decodes to NaN throughout, so an overflow stays
/// visible downstream (e.g. to a loss scaler) instead of silently corrupting its neighbours.
///
/// Cost: two passes over each block (absmax, quantise) while it sits in L1; the inner loops
/// are branch-free so the compiler vectorises them. Stateless: const and thread-safe.
template <std::size_t B = 256>
struct int8_block {
  static_assert(B >= 1 && B <= (std::size_t{1} << 24),
                "int8_block: block size must be in [1, 2^24]");
  static constexpr const char* name = "int8_block";
  static constexpr bool fixed_size = true;
  static constexpr std::size_t block_size = B;

  [[nodiscard]] static constexpr std::size_t blocks(std::size_t n) noexcept {
    return (n + B - 1) / B;
  }
  [[nodiscard]] static constexpr std::size_t max_encoded_bytes(std::size_t n) noexcept {
    return blocks(n) * sizeof(float) + n;
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) const {
    const std::size_t n = in.size(), bytes = max_encoded_bytes(n);
    detail::check_encode_room(name, n, out.size(), bytes);
    auto* dst = reinterpret_cast<unsigned char*>(out.data());
    for (std::size_t begin = 0; begin < n; begin += B) {
      const std::size_t len = std::min(B, n - begin);
      encode_block(in.data() + begin, len, dst);
      dst += sizeof(float) + len;
    }
    return bytes;
  }

  void decode(std::span<const std::byte> bytes, std::span<float> out) const {
    validate(bytes, out.size());
    for_each_block(bytes, out.size(),
                   [&](float scale, const unsigned char* q, std::size_t begin, std::size_t len) {
                     float* __restrict o = out.data() + begin;
                     for (std::size_t i = 0; i < len; ++i)
                       o[i] = scale * static_cast<float>(static_cast<std::int8_t>(q[i]));
                   });
  }

  void decode_add(std::span<const std::byte> bytes, std::span<float> acc) const {
    validate(bytes, acc.size());
    for_each_block(bytes, acc.size(),
                   [&](float scale, const unsigned char* q, std::size_t begin, std::size_t len) {
                     float* __restrict a = acc.data() + begin;
                     for (std::size_t i = 0; i < len; ++i)
                       a[i] += scale * static_cast<float>(static_cast<std::int8_t>(q[i]));
                   });
  }

 private:
  static constexpr std::uint32_t infinity_bits = 0x7f80'0000u;
  /// Below this absmax (≈ 7.9e-31) 127 / absmax might overflow a float: quantise in double.
  static constexpr std::uint32_t tiny_bits = 0x0d80'0000u;

  static void encode_block(const float* __restrict x, std::size_t len,
                           unsigned char* __restrict dst) {
    // absmax on the bit patterns: for |x| the integer order is the float order, NaN sorts above
    // inf, and an integer max reduction vectorises without -ffast-math.
    std::uint32_t top = 0;
    for (std::size_t i = 0; i < len; ++i)
      top = std::max(top, std::bit_cast<std::uint32_t>(x[i]) & 0x7fff'ffffu);
    unsigned char* __restrict q = dst + sizeof(float);
    float scale = 0.0f;
    if (top >= infinity_bits) {  // inf or NaN in the block: poison it visibly
      scale = std::numeric_limits<float>::quiet_NaN();
      std::memset(q, 0, len);
    } else if (top == 0) {  // all zeros (either sign)
      std::memset(q, 0, len);
    } else if (top < tiny_bits) {
      const double absmax = static_cast<double>(std::bit_cast<float>(top));
      scale = static_cast<float>(absmax / 127.0);
      const double inverse = 127.0 / absmax;
      for (std::size_t i = 0; i < len; ++i)
        q[i] = static_cast<unsigned char>(
            static_cast<std::int8_t>(std::nearbyint(static_cast<double>(x[i]) * inverse)));
    } else {
      const float absmax = std::bit_cast<float>(top);
      scale = absmax / 127.0f;
      const float inverse = 127.0f / absmax;
      // Adding and subtracting 1.5·2^23 rounds to the nearest integer (ties to even) for
      // |v| < 2^22; branch-free so the loop vectorises.
      constexpr float round_magic = 12582912.0f;
      for (std::size_t i = 0; i < len; ++i) {
        float v = (x[i] * inverse + round_magic) - round_magic;
        v = std::min(127.0f, std::max(-127.0f, v));
        q[i] = static_cast<unsigned char>(static_cast<std::int8_t>(static_cast<int>(v)));
      }
    }
    std::memcpy(dst, &scale, sizeof(float));
  }

  /// Checks the size and every block's scale (finite and ≥ 0, or NaN for a poisoned block).
  static void validate(std::span<const std::byte> bytes, std::size_t n) {
    detail::check_message_size(name, n, bytes.size(), max_encoded_bytes(n));
    const auto* src = reinterpret_cast<const unsigned char*>(bytes.data());
    for (std::size_t begin = 0; begin < n; begin += B) {
      float scale;
      std::memcpy(&scale, src, sizeof(float));
      if (!(scale >= 0.0f && scale < std::numeric_limits<float>::infinity()) && !std::isnan(scale))
        fail(errc::bad_message, cat(name, ": block ", begin / B, " has scale ", scale,
                                    " (must be finite and >= 0); the message is corrupt"));
      src += sizeof(float) + std::min(B, n - begin);
    }
  }

  template <class Fn>
  static void for_each_block(std::span<const std::byte> bytes, std::size_t n, Fn&& fn) {
    const auto* src = reinterpret_cast<const unsigned char*>(bytes.data());
    for (std::size_t begin = 0; begin < n; begin += B) {
      const std::size_t len = std::min(B, n - begin);
      float scale;
      std::memcpy(&scale, src, sizeof(float));
      fn(scale, src + sizeof(float), begin, len);
      src += sizeof(float) + len;
    }
  }
};

static_assert(fixed_size_compressor<int8_block<>>);

}  // namespace strata::compress

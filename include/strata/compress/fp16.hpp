/// @file fp16.hpp
/// The `fp16` codec: IEEE 754 binary16 ("half") with round-to-nearest-even, in portable bit
/// arithmetic (no F16C or `_Float16` needed), 2 bytes per value.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "strata/compress/concepts.hpp"

namespace strata::compress {

/// float → binary16 bits, round to nearest, ties to even. Overflow (|x| ≥ 65520) becomes ±inf,
/// values below the half subnormal range round to ±0, subnormal halves are produced exactly,
/// inf stays inf and NaN stays a (quiet) NaN keeping the top payload bits. Pure function.
/// (After F. Giesen's float_to_half_fast3_rtne; needs the default rounding mode.)
constexpr std::uint16_t float_to_half(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7fff'ffffu;
  // Every case is computed and one is selected (no branches), so loops over it vectorise.
  // inf or NaN (a NaN stays quiet and keeps its top payload bits):
  const std::uint32_t special =
      magnitude > 0x7f80'0000u ? 0x7e00u | ((magnitude >> 13) & 0x3ffu) : 0x7c00u;
  // below 2^-14, a half subnormal or zero: adding 0.5 lines its bits up with the float
  // mantissa and the FPU rounds to nearest even.
  const std::uint32_t subnormal =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(magnitude) + 0.5f) - 0x3f00'0000u;
  // normal: rebias the exponent and round the 13 dropped mantissa bits to even.
  const std::uint32_t normal = (magnitude + (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu +
                                ((magnitude >> 13) & 1u)) >>
                               13;
  const std::uint32_t half = magnitude >= 0x7f80'0000u   ? special
                             : magnitude >= 0x477f'f000u ? 0x7c00u  // ≥ 65520 rounds to inf
                             : magnitude < 0x3880'0000u  ? subnormal
                                                         : normal;
  return static_cast<std::uint16_t>(half | sign);
}

/// binary16 bits → float (exact: every half is a float). Pure function.
constexpr float half_to_float(std::uint16_t half) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  std::uint32_t bits = static_cast<std::uint32_t>(half & 0x7fffu) << 13;
  const std::uint32_t exponent = bits & 0x0f80'0000u;
  bits += static_cast<std::uint32_t>(127 - 15) << 23;
  if (exponent == 0x0f80'0000u) {  // inf / NaN: exponent all ones
    bits += static_cast<std::uint32_t>(128 - 16) << 23;
  } else if (exponent == 0) {  // zero / subnormal: renormalise through a float subtraction
    bits += 1u << 23;
    bits =
        std::bit_cast<std::uint32_t>(std::bit_cast<float>(bits) - std::bit_cast<float>(113u << 23));
  }
  return std::bit_cast<float>(bits | sign);
}

/// Sends each float as an IEEE binary16 (2 bytes, little-endian): 2× fewer bytes than fp32.
/// Error: relative ≤ 2^-11 for |x| in the half normal range [2^-14, 65504]; absolute ≤ 2^-25
/// below it; |x| ≥ 65520 becomes ±inf. inf/NaN policy: inf → inf, NaN → NaN (never hidden).
/// Cost: O(n) bit arithmetic. Stateless: every member is const and thread-safe.
struct fp16 {
  static constexpr const char* name = "fp16";
  static constexpr bool fixed_size = true;

  [[nodiscard]] static constexpr std::size_t max_encoded_bytes(std::size_t n) noexcept {
    return n * sizeof(std::uint16_t);
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) const {
    const std::size_t bytes = max_encoded_bytes(in.size());
    detail::check_encode_room(name, in.size(), out.size(), bytes);
    auto* dst = reinterpret_cast<unsigned char*>(out.data());
    const float* src = in.data();
    for (std::size_t i = 0; i < in.size(); ++i) {
      const std::uint16_t h = float_to_half(src[i]);
      dst[2 * i] = static_cast<unsigned char>(h & 0xffu);
      dst[2 * i + 1] = static_cast<unsigned char>(h >> 8);
    }
    return bytes;
  }

  void decode(std::span<const std::byte> bytes, std::span<float> out) const {
    detail::check_message_size(name, out.size(), bytes.size(), max_encoded_bytes(out.size()));
    const auto* src = reinterpret_cast<const unsigned char*>(bytes.data());
    for (std::size_t i = 0; i < out.size(); ++i)
      out[i] = half_to_float(load(src, i));
  }

  void decode_add(std::span<const std::byte> bytes, std::span<float> acc) const {
    detail::check_message_size(name, acc.size(), bytes.size(), max_encoded_bytes(acc.size()));
    const auto* src = reinterpret_cast<const unsigned char*>(bytes.data());
    for (std::size_t i = 0; i < acc.size(); ++i)
      acc[i] += half_to_float(load(src, i));
  }

 private:
  static std::uint16_t load(const unsigned char* src, std::size_t i) noexcept {
    return static_cast<std::uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
  }
};

static_assert(fixed_size_compressor<fp16>);

}  // namespace strata::compress

/// @file identity.hpp
/// The `identity` codec: raw fp32 bytes (the baseline every other codec is measured against).
#pragma once

#include <cstddef>
#include <cstring>
#include <span>

#include "strata/compress/concepts.hpp"

namespace strata::compress {

/// Sends floats as their raw 4-byte IEEE binary32 representation (host = little-endian order).
/// Lossless (inf, NaN payloads and -0 survive), 4 bytes per value. Cost: one memcpy per call.
/// Stateless: every member is const and thread-safe.
struct identity {
  static constexpr const char* name = "identity";
  static constexpr bool fixed_size = true;

  [[nodiscard]] static constexpr std::size_t max_encoded_bytes(std::size_t n) noexcept {
    return n * sizeof(float);
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) const {
    const std::size_t bytes = max_encoded_bytes(in.size());
    detail::check_encode_room(name, in.size(), out.size(), bytes);
    if (bytes != 0) std::memcpy(out.data(), in.data(), bytes);
    return bytes;
  }

  void decode(std::span<const std::byte> bytes, std::span<float> out) const {
    detail::check_message_size(name, out.size(), bytes.size(), max_encoded_bytes(out.size()));
    if (!bytes.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  }

  void decode_add(std::span<const std::byte> bytes, std::span<float> acc) const {
    detail::check_message_size(name, acc.size(), bytes.size(), max_encoded_bytes(acc.size()));
    const std::byte* src = bytes.data();
    float* __restrict a = acc.data();
    const std::size_t n = acc.size();
    for (std::size_t i = 0; i < n; ++i) {
      float v;
      std::memcpy(&v, src + i * sizeof(float), sizeof(float));
      a[i] += v;
    }
  }
};

static_assert(fixed_size_compressor<identity>);

}  // namespace strata::compress

/// @file error_feedback.hpp
/// `error_feedback<C>`: wraps a codec and carries what compression dropped (the residual) into
/// the next encode of the same positions, so over many steps nothing is lost.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "strata/compress/concepts.hpp"
#include "strata/core/buffer.hpp"

namespace strata::compress {

/// Error feedback (Seide et al. 2014; Karimireddy et al. 2019) around codec `C`, bound to a
/// buffer of `length()` positions (typically one flat gradient buffer).
///
/// `encode_at(offset, x, out)` encodes `v = x + r[offset, offset + |x|)` with `C`, decodes the
/// result `d` and stores the new residual `r = v − d` at those positions. So over T steps the
/// sum of what was decoded equals the sum of the inputs minus the current residual: the error
/// stays bounded by one step's compression error instead of growing with T. `encode(x, out)`
/// is `encode_at(0, x, out)`. Decoding is `C`'s (the residual lives on the sender only).
///
/// Non-finite policy: residual entries that come out inf/NaN (an overflowed step) are reset to
/// 0, so one bad step does not poison every later one.
///
/// Cost: `C`'s encode plus one decode and two O(n) passes. Thread-safety: encode mutates the
/// residual and a scratch buffer, so one object must not encode from two threads at once;
/// decode is const and thread-safe. Models `positional_compressor`.
template <compressor C>
class error_feedback {
 public:
  static constexpr const char* name = "error_feedback";
  static constexpr bool fixed_size = fixed_size_compressor<C>;
  using codec_type = C;

  /// Residual of `length` positions, all zero; `codec` is the wrapped codec.
  explicit error_feedback(std::size_t length, C codec = C{})
      : codec_(std::move(codec)), residual_(length) {}

  [[nodiscard]] std::size_t length() const noexcept { return residual_.size(); }
  [[nodiscard]] std::span<const float> residual() const noexcept { return residual_.span(); }
  [[nodiscard]] const C& codec() const noexcept { return codec_; }
  /// Forgets the residual (e.g. after the buffer's meaning changed).
  void reset() noexcept { std::fill(residual_.begin(), residual_.end(), 0.0f); }
  /// Restores a residual saved earlier (checkpoint resume); its length must be `length()`.
  void restore_residual(std::span<const float> saved) {
    STRATA_EXPECTS(saved.size() == length(), "error_feedback: restoring a residual of ",
                   saved.size(), " positions into one of ", length());
    std::copy(saved.begin(), saved.end(), residual_.begin());
  }

  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const {
    return codec_.max_encoded_bytes(n);
  }

  /// Encodes `in` as the values at positions [offset, offset + in.size()).
  std::size_t encode_at(std::size_t offset, std::span<const float> in, std::span<std::byte> out) {
    STRATA_EXPECTS(offset <= length() && in.size() <= length() - offset,
                   "error_feedback: positions [", offset, ", ", offset + in.size(),
                   ") lie outside the residual of ", length(),
                   " positions; construct it with the length of the buffer you encode");
    const std::size_t n = in.size();
    if (corrected_.size() < n) corrected_.resize(n);
    std::span<float> r = residual_.span().subspan(offset, n);
    float* __restrict v = corrected_.data();
    for (std::size_t i = 0; i < n; ++i)
      v[i] = in[i] + r[i];
    const std::size_t bytes = codec_.encode(std::span<const float>(v, n), out);
    codec_.decode(std::span<const std::byte>(out.data(), bytes), r);  // r = decoded
    for (std::size_t i = 0; i < n; ++i) {
      const float e = v[i] - r[i];
      // Keep only finite residuals (exponent bits not all ones).
      r[i] = (std::bit_cast<std::uint32_t>(e) & 0x7f80'0000u) != 0x7f80'0000u ? e : 0.0f;
    }
    return bytes;
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    return encode_at(0, in, out);
  }
  void decode(std::span<const std::byte> bytes, std::span<float> out) const {
    codec_.decode(bytes, out);
  }
  void decode_add(std::span<const std::byte> bytes, std::span<float> acc) const {
    codec_.decode_add(bytes, acc);
  }

 private:
  C codec_;
  aligned_buffer<float> residual_;
  std::vector<float> corrected_;  ///< scratch: input + residual
};

}  // namespace strata::compress

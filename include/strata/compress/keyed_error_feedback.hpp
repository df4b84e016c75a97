/// @file keyed_error_feedback.hpp
/// `keyed_error_feedback<C>`: error feedback for rows addressed by key — a sparse push sends a
/// different set of embedding rows every step, so the residual is kept per key, not per
/// position of one buffer (`error_feedback<C>`).
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "strata/compress/concepts.hpp"
#include "strata/core/error.hpp"
#include "strata/core/key_index.hpp"

namespace strata::compress {

/// Error feedback around codec `C` for rows of `dim` values, one residual row per key seen.
///
/// `encode_rows(keys, rows, out)` encodes v = rows + r[key] (row j belongs to keys[j]) with `C`
/// as one block, decodes the result d and stores r[key] = v − d for each row, so over many
/// steps the sum of what a key's rows decoded to equals the sum of its inputs minus its current
/// residual. Keys must be distinct within one call. Residual entries that come out inf/NaN are
/// reset to 0 (as `error_feedback`). Decoding is `C`'s.
///
/// Memory: dim floats per key ever encoded (a table's touched rows). Not thread-safe: one
/// object per sender (a PS client keeps one per table).
template <compressor C>
class keyed_error_feedback {
 public:
  static constexpr const char* name = "keyed_error_feedback";
  using codec_type = C;

  explicit keyed_error_feedback(std::size_t dim, C codec = C{})
      : codec_(std::move(codec)), dim_(dim) {
    STRATA_EXPECTS(dim >= 1, "keyed_error_feedback: the row length must be ≥ 1");
  }

  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  [[nodiscard]] const C& codec() const noexcept { return codec_; }
  /// Keys that have a residual row.
  [[nodiscard]] std::size_t size() const noexcept { return index_.size(); }
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t values) const {
    return codec_.max_encoded_bytes(values);
  }

  /// Encodes `rows` (keys.size() × dim, row-major) plus each key's residual into `out`;
  /// returns the bytes written and keeps the new residuals.
  std::size_t encode_rows(std::span<const std::uint64_t> keys, std::span<const float> rows,
                          std::span<std::byte> out) {
    const std::size_t n = keys.size(), values = n * dim_;
    STRATA_EXPECTS(rows.size() == values, "keyed_error_feedback::encode_rows: ", rows.size(),
                   " values for ", n, " keys of ", dim_);
    corrected_.resize(values);
    slots_.resize(n);
    for (std::size_t j = 0; j < n; ++j) {
      slots_[j] = slot(keys[j]);
      const float* r = data_.data() + slots_[j] * dim_;
      for (std::size_t c = 0; c < dim_; ++c)
        corrected_[j * dim_ + c] = rows[j * dim_ + c] + r[c];
    }
    const std::size_t bytes = codec_.encode(std::span<const float>(corrected_), out);
    decoded_.resize(values);
    codec_.decode(out.first(bytes), std::span<float>(decoded_));
    for (std::size_t j = 0; j < n; ++j) {
      float* r = data_.data() + slots_[j] * dim_;
      for (std::size_t c = 0; c < dim_; ++c) {
        const float e = corrected_[j * dim_ + c] - decoded_[j * dim_ + c];
        // Keep only finite residuals (exponent bits not all ones).
        r[c] = (std::bit_cast<std::uint32_t>(e) & 0x7f80'0000u) != 0x7f80'0000u ? e : 0.0f;
      }
    }
    return bytes;
  }
  void decode(std::span<const std::byte> bytes, std::span<float> out) const {
    codec_.decode(bytes, out);
  }

  /// Calls fn(key, residual row) for every key with a residual (to carry them elsewhere).
  template <class Fn>
  void for_each_residual(Fn&& fn) const {
    const auto keys = index_.keys();
    for (std::size_t s = 0; s < keys.size(); ++s)
      fn(keys[s], std::span<const float>(data_.data() + s * dim_, dim_));
  }
  /// Sets the residual row of `key` (a checkpoint's, or another object's).
  void restore(std::uint64_t key, std::span<const float> values) {
    STRATA_EXPECTS(values.size() == dim_, "keyed_error_feedback::restore: ", values.size(),
                   " values for a row of ", dim_);
    const std::size_t s = slot(key);  // may grow data_: before taking an iterator into it
    std::copy(values.begin(), values.end(), data_.begin() + static_cast<std::ptrdiff_t>(s * dim_));
  }
  /// The residual row of `key` (zeros if it has none).
  [[nodiscard]] std::vector<float> residual(std::uint64_t key) const {
    const auto s = index_.find(key);
    if (s == key_index::npos) return std::vector<float>(dim_, 0.0f);
    const float* r = data_.data() + s * dim_;
    return {r, r + dim_};
  }
  /// Forgets every residual.
  void clear() {
    index_ = key_index();
    data_.clear();
  }

 private:
  std::size_t slot(std::uint64_t key) {
    const auto [s, inserted] = index_.find_or_insert(key);
    if (inserted) data_.resize(data_.size() + dim_, 0.0f);
    return static_cast<std::size_t>(s);
  }

  C codec_;
  std::size_t dim_;
  key_index index_;          ///< key → residual row
  std::vector<float> data_;  ///< residual rows, in slot order
  std::vector<float> corrected_, decoded_;
  std::vector<std::size_t> slots_;
};

}  // namespace strata::compress

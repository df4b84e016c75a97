/// @file topk.hpp
/// The `topk` codec: keeps the k = ceil(fraction · n) largest magnitudes as (index, value)
/// pairs — sparsification, usually paired with `error_feedback` so dropped mass is not lost.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "strata/compress/concepts.hpp"

namespace strata::compress {

/// Top-k sparsification. Keeps the k = ceil(fraction · n) entries of largest magnitude
/// (k ≥ 1 when n ≥ 1) and drops the rest. Ties in magnitude go to the lower index, so the
/// choice is deterministic. Wire format: k pairs (uint32 index, fp32 value), 8 bytes each, in
/// strictly increasing index order; the size varies with n only, but a decoder accepts any
/// count ≤ n (so `max_encoded_bytes` is a bound, not the exact size: not `fixed_size`).
///
/// Kept values are exact; everything else decodes to 0. Non-finite policy: NaN counts as the
/// largest magnitude, then ±inf, so non-finite values are always kept and sent as they are.
///
/// Cost: O(n) average (a copy of the magnitudes, `std::nth_element`, two linear scans).
/// Thread-safety: `encode` reuses a scratch buffer in the object, so one object must not
/// encode from two threads at once; `decode`/`decode_add` are const and thread-safe.
class topk {
 public:
  static constexpr const char* name = "topk";

  /// `fraction` in (0, 1]: the share of entries kept.
  explicit topk(double fraction = 0.01) : fraction_(fraction) {
    STRATA_EXPECTS(fraction > 0.0 && fraction <= 1.0,
                   "topk: fraction must be in (0, 1] (the share of entries kept), got ", fraction);
  }

  [[nodiscard]] double fraction() const noexcept { return fraction_; }

  /// Entries kept out of `n`: ceil(fraction · n), at least 1 when n ≥ 1, at most n.
  [[nodiscard]] std::size_t kept(std::size_t n) const noexcept {
    if (n == 0) return 0;
    const double k = std::ceil(fraction_ * static_cast<double>(n) - 1e-9);
    return std::clamp<std::size_t>(static_cast<std::size_t>(std::max(k, 1.0)), 1, n);
  }
  [[nodiscard]] std::size_t max_encoded_bytes(std::size_t n) const noexcept {
    return kept(n) * pair_bytes;
  }

  std::size_t encode(std::span<const float> in, std::span<std::byte> out) {
    const std::size_t n = in.size(), k = kept(n);
    STRATA_EXPECTS(n <= std::numeric_limits<std::uint32_t>::max(), "topk: ", n,
                   " values exceed the 32-bit index of the wire format; encode in chunks");
    detail::check_encode_room(name, n, out.size(), k * pair_bytes);
    if (k == 0) return 0;
    // Magnitude keys: |x| bit patterns order like |x|, with NaN above inf.
    keys_.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      keys_[i] = key(in[i]);
    std::uint32_t threshold = 0;
    std::size_t take_equal = k;
    if (k < n) {
      std::nth_element(keys_.begin(), keys_.begin() + static_cast<std::ptrdiff_t>(k - 1),
                       keys_.end(), std::greater<>());
      threshold = keys_[k - 1];
      std::size_t above = 0;
      for (std::size_t i = 0; i < n; ++i)
        above += key(in[i]) > threshold ? 1 : 0;
      take_equal = k - above;  // ties at the threshold: the lowest indices win
    }
    auto* dst = reinterpret_cast<unsigned char*>(out.data());
    std::size_t written = 0;
    for (std::size_t i = 0; i < n && written < k; ++i) {
      const std::uint32_t kk = key(in[i]);
      const bool keep = k == n || kk > threshold || (kk == threshold && take_equal > 0);
      if (!keep) continue;
      if (k != n && kk == threshold) --take_equal;
      const auto index = static_cast<std::uint32_t>(i);
      std::memcpy(dst + written * pair_bytes, &index, sizeof index);
      std::memcpy(dst + written * pair_bytes + sizeof index, &in[i], sizeof(float));
      ++written;
    }
    if (written != k)
      fail(errc::internal, cat("topk: selected ", written, " of ", k, " entries (a bug)"));
    return k * pair_bytes;
  }

  void decode(std::span<const std::byte> bytes, std::span<float> out) const {
    validate(bytes, out.size());
    std::fill(out.begin(), out.end(), 0.0f);
    for_each_pair(bytes, [&](std::uint32_t index, float value) { out[index] = value; });
  }

  void decode_add(std::span<const std::byte> bytes, std::span<float> acc) const {
    validate(bytes, acc.size());
    for_each_pair(bytes, [&](std::uint32_t index, float value) { acc[index] += value; });
  }

 private:
  static constexpr std::size_t pair_bytes = sizeof(std::uint32_t) + sizeof(float);

  static std::uint32_t key(float x) noexcept {
    return std::bit_cast<std::uint32_t>(x) & 0x7fff'ffffu;
  }

  /// Size a whole number of pairs, at most n of them, indices strictly increasing and < n.
  static void validate(std::span<const std::byte> bytes, std::size_t n) {
    if (bytes.size() % pair_bytes != 0 || bytes.size() / pair_bytes > n)
      fail(errc::bad_message,
           cat(name, ": message of ", bytes.size(), " bytes is not a whole number (at most ", n,
               ") of 8-byte (index, value) pairs for ", n,
               " values; was it truncated, or encoded for another length?"));
    std::uint64_t next = 0;  // the smallest index allowed next
    for_each_pair(bytes, [&](std::uint32_t index, float) {
      if (index < next || index >= n)
        fail(errc::bad_message, cat(name, ": pair index ", index, " is out of order or outside ", n,
                                    " values; the message is corrupt"));
      next = std::uint64_t{index} + 1;
    });
  }

  template <class Fn>
  static void for_each_pair(std::span<const std::byte> bytes, Fn&& fn) {
    const std::byte* src = bytes.data();
    for (std::size_t p = 0, count = bytes.size() / pair_bytes; p < count; ++p) {
      std::uint32_t index;
      float value;
      std::memcpy(&index, src + p * pair_bytes, sizeof index);
      std::memcpy(&value, src + p * pair_bytes + sizeof index, sizeof value);
      fn(index, value);
    }
  }

  double fraction_;
  std::vector<std::uint32_t> keys_;  ///< scratch for the selection
};

static_assert(compressor<topk> && !fixed_size_compressor<topk>);

}  // namespace strata::compress

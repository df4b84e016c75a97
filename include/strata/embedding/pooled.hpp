/// @file pooled.hpp
/// Pooled (bag) lookups for multi-hot features: each bag of keys becomes one row, the sum or
/// mean of its keys' rows; and the matching backward pass that turns dLoss/d(bag row) into one
/// gradient row per key for `apply_gradients` (or hands d_out to a storage's fused
/// `apply_pooled_gradients`).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/embedding/concepts.hpp"
#include "strata/embedding/detail/rows.hpp"

namespace strata::embedding {

/// How a bag's rows are combined.
enum class pooling {
  sum,   ///< out = Σ rows
  mean,  ///< out = Σ rows / bag length (an empty bag gives zeros)
};

/// Validates CSR bag offsets for `key_count` keys: bag b is keys[offsets[b] .. offsets[b+1]),
/// so offsets has B + 1 entries, starts at 0, never decreases and ends at key_count.
/// Throws `errc::invalid_argument` naming the first offending entry.
inline void check_offsets(std::span<const std::uint64_t> offsets, std::size_t key_count) {
  STRATA_EXPECTS(!offsets.empty(),
                 "pooled: offsets is empty; pass B + 1 offsets for B bags (just {0} for none)");
  STRATA_EXPECTS(offsets.front() == 0, "pooled: offsets[0] is ", offsets.front(),
                 " but must be 0 (bag b is keys[offsets[b], offsets[b+1]))");
  bool monotone = true;  // branch-free pass (vectorised); locate the bag only on failure
  for (std::size_t b = 0; b + 1 < offsets.size(); ++b)
    monotone &= offsets[b] <= offsets[b + 1];
  for (std::size_t b = 0; !monotone && b + 1 < offsets.size(); ++b)
    STRATA_EXPECTS(offsets[b] <= offsets[b + 1], "pooled: offsets decrease at bag ", b, " (",
                   offsets[b], " > ", offsets[b + 1], "); offsets must be non-decreasing");
  STRATA_EXPECTS(offsets.back() == key_count, "pooled: last offset is ", offsets.back(),
                 " but there are ", key_count, " keys; the last offset must equal keys.size()");
}

namespace detail {
/// Runs body(first_bag, last_bag) over bags, in parallel when the work is large.
template <class Body>
void for_bags(std::span<const std::uint64_t> offsets, std::size_t dim, Body&& body) {
  const std::size_t bags = offsets.size() - 1;
  if ((offsets.back() + bags) * dim < parallel_floats) {
    body(std::size_t{0}, bags);
  } else {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, bags, 16),
                      [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); });
  }
}

/// Pools bags [first, last): out.row(b) ← sum/mean of row_of(i) over bag b, prefetching a few
/// rows ahead. `Dim` > 0 fixes the width at compile time so the accumulator lives in registers;
/// `Dim` == 0 reads it from out.
template <std::size_t Dim, class RowOf>
void pool_range(std::span<const std::uint64_t> offsets, pooling mode, matrix_view<float> out,
                const RowOf& row_of, std::size_t first, std::size_t last) {
  const std::size_t dim = Dim > 0 ? Dim : out.cols();
  const std::size_t end_key = offsets[last];
  for (std::size_t b = first; b < last; ++b) {
    float* dst = out.row(b).data();
    float acc[Dim > 0 ? Dim : 1];
    if constexpr (Dim > 0)
      std::fill(acc, acc + Dim, 0.0f);
    else
      std::fill(dst, dst + dim, 0.0f);
    float* sum = Dim > 0 ? acc : dst;
    for (std::size_t i = offsets[b]; i < offsets[b + 1]; ++i) {
      if (i + prefetch_distance < end_key) prefetch_row(row_of(i + prefetch_distance), dim);
      const float* src = row_of(i);
      for (std::size_t c = 0; c < dim; ++c)
        sum[c] += src[c];
    }
    const std::size_t len = offsets[b + 1] - offsets[b];
    const float scale = mode == pooling::mean && len > 1 ? 1.0f / static_cast<float>(len) : 1.0f;
    if (Dim > 0 || scale != 1.0f)
      for (std::size_t c = 0; c < dim; ++c)
        dst[c] = sum[c] * scale;
  }
}

/// out.row(b) ← pooled rows row_of(i) for i in bag b, tbb-parallel over bags when large.
template <class RowOf>
void pool_rows(std::span<const std::uint64_t> offsets, pooling mode, matrix_view<float> out,
               RowOf&& row_of) {
  for_bags(offsets, out.cols(), [&](std::size_t first, std::size_t last) {
    switch (out.cols()) {
      case 8:
        return pool_range<8>(offsets, mode, out, row_of, first, last);
      case 16:
        return pool_range<16>(offsets, mode, out, row_of, first, last);
      case 32:
        return pool_range<32>(offsets, mode, out, row_of, first, last);
      case 64:
        return pool_range<64>(offsets, mode, out, row_of, first, last);
      case 128:
        return pool_range<128>(offsets, mode, out, row_of, first, last);
      default:
        return pool_range<0>(offsets, mode, out, row_of, first, last);
    }
  });
}

/// Checks the arguments of a storage's `apply_pooled_gradients`: CSR offsets over the keys
/// (`errc::invalid_argument`) and d_out of bags × spec.dim (`errc::size_mismatch`).
inline void check_pooled_gradients(std::string_view who, std::size_t table, const table_spec& spec,
                                   std::span<const std::uint64_t> keys,
                                   std::span<const std::uint64_t> offsets,
                                   matrix_view<const float> d_out) {
  check_offsets(offsets, keys.size());
  const std::size_t bags = offsets.size() - 1;
  if (d_out.rows() != bags || d_out.cols() != spec.dim)
    fail(errc::size_mismatch,
         cat(who, ": d_out is ", d_out.rows(), " x ", d_out.cols(), " but table ", table, " '",
             spec.name, "' needs ", bags, " x ", spec.dim, " (one row of dim values per bag)"));
}

/// The rows whose per-key sums are the keys' gradients in a pooled backward: d_out itself for
/// sum; for mean, d_out.row(b) · (1/len(b)) rounded to float exactly as `unpool` stores it,
/// written once per bag into `scaled` (a pass of its own, so the product is never fused into
/// the sums that follow).
inline matrix_view<const float> bag_gradients(matrix_view<const float> d_out,
                                              std::span<const std::uint64_t> offsets, pooling mode,
                                              std::vector<float>& scaled) {
  if (mode == pooling::sum) return d_out;
  const std::size_t bags = d_out.rows(), dim = d_out.cols();
  scaled.resize(bags * dim);
  for (std::size_t b = 0; b < bags; ++b) {
    const std::size_t len = offsets[b + 1] - offsets[b];
    if (len == 0) continue;
    const float scale = 1.0f / static_cast<float>(len);
    const float* in = d_out.row(b).data();
    float* out = scaled.data() + b * dim;
    for (std::size_t c = 0; c < dim; ++c)
      out[c] = in[c] * scale;
  }
  return {scaled.data(), bags, dim, dim};
}
}  // namespace detail

/// out.row(b) ← sum or mean of rows.row(i) over bag b, where rows holds one gathered row per
/// key. Throws on bad offsets or shapes. Cost: one pass over rows; tbb-parallel over bags.
inline void pool(matrix_view<const float> rows, std::span<const std::uint64_t> offsets,
                 pooling mode, matrix_view<float> out) {
  check_offsets(offsets, rows.rows());
  if (out.rows() != offsets.size() - 1 || out.cols() != rows.cols())
    fail(errc::size_mismatch,
         cat("pool: out is ", out.rows(), " x ", out.cols(), " but ", offsets.size() - 1,
             " bags of rows of ", rows.cols(), " need ", offsets.size() - 1, " x ", rows.cols()));
  detail::pool_rows(offsets, mode, out, [&](std::size_t i) { return rows.row(i).data(); });
}

/// Backward of `pool`: key_grads.row(i) ← d_out.row(b) for key i in bag b, times 1/len(b) for
/// mean. The result feeds `apply_gradients(table, keys, key_grads)`, which sums duplicates.
/// Throws on bad offsets or shapes. Cost: one write per key value; tbb-parallel over bags.
inline void unpool(matrix_view<const float> d_out, std::span<const std::uint64_t> offsets,
                   pooling mode, matrix_view<float> key_grads) {
  check_offsets(offsets, key_grads.rows());
  if (d_out.rows() != offsets.size() - 1 || d_out.cols() != key_grads.cols())
    fail(errc::size_mismatch,
         cat("unpool: d_out is ", d_out.rows(), " x ", d_out.cols(), " but there are ",
             offsets.size() - 1, " bags and key gradient rows of ", key_grads.cols()));
  const std::size_t dim = d_out.cols();
  detail::for_bags(offsets, dim, [&](std::size_t first, std::size_t last) {
    for (std::size_t b = first; b < last; ++b) {
      const std::size_t len = offsets[b + 1] - offsets[b];
      const float scale = mode == pooling::mean ? 1.0f / static_cast<float>(len) : 1.0f;
      const float* src = d_out.row(b).data();
      for (std::size_t i = offsets[b]; i < offsets[b + 1]; ++i) {
        float* dst = key_grads.row(i).data();
        for (std::size_t c = 0; c < dim; ++c)
          dst[c] = src[c] * scale;
      }
    }
  });
}

/// Pooled lookup over any `storage`, with reusable buffers:
/// - `forward(s, table, keys, offsets, mode, out)`: out (B × dim) ← pooled rows of each bag.
///   Storages that expose their dense weights (`local`) are read in place with software
///   prefetch (one pass, no intermediate buffer); others are gathered first, then pooled.
///   A storage that creates rows on gather (`hash_table`) creates them here too.
/// - `backward(s, table, keys, offsets, mode, d_out)`: storages that offer
///   `apply_pooled_gradients(table, keys, offsets, mode, d_out)` (`local`) get d_out directly
///   and sum it per key without per-key rows (fused); others get the per-key gradient rows
///   (`key_grads()`, built by `unpool`) through `s.apply_gradients(table, keys, key_grads)`.
///   Both give bitwise the same rows.
/// Not thread-safe: one `pooled_lookup` per thread.
class pooled_lookup {
 public:
  template <storage S>
  void forward(S& s, std::size_t table, std::span<const std::uint64_t> keys,
               std::span<const std::uint64_t> offsets, pooling mode, matrix_view<float> out) {
    check_offsets(offsets, keys.size());
    detail::check_table("pooled_lookup::forward", table, s.table_count());
    const table_spec& spec = s.spec(table);
    detail::check_shape("pooled_lookup::forward", "out", table, spec, out.rows(),
                        offsets.size() - 1, out.cols());
    if constexpr (requires {
                    { s.weights(table) } -> std::convertible_to<matrix_view<const float>>;
                  }) {
      detail::check_keys("pooled_lookup::forward", table, spec, keys);
      const matrix_view<const float> w = s.weights(table);
      const float* base = w.data();
      const std::size_t dim = spec.dim;
      detail::pool_rows(offsets, mode, out, [&](std::size_t i) { return base + keys[i] * dim; });
    } else {
      rows_.resize(keys.size() * spec.dim);
      const matrix_view<float> rows(rows_.data(), keys.size(), spec.dim);
      s.gather(table, keys, rows);
      pool(rows, offsets, mode, out);
    }
  }

  template <storage S>
  void backward(S& s, std::size_t table, std::span<const std::uint64_t> keys,
                std::span<const std::uint64_t> offsets, pooling mode,
                matrix_view<const float> d_out) {
    detail::check_table("pooled_lookup::backward", table, s.table_count());
    const std::size_t dim = s.spec(table).dim;
    dim_ = dim;
    if constexpr (requires { s.apply_pooled_gradients(table, keys, offsets, mode, d_out); }) {
      grads_.clear();  // fused: no per-key rows
      s.apply_pooled_gradients(table, keys, offsets, mode, d_out);
    } else {
      grads_.resize(keys.size() * dim);
      unpool(d_out, offsets, mode, {grads_.data(), keys.size(), dim});
      s.apply_gradients(table, keys, key_grads());
    }
  }

  /// Per-key gradient rows of the last backward (keys.size() × dim) when it went through
  /// `unpool` + `apply_gradients`; 0 × dim after a fused backward (storages with
  /// `apply_pooled_gradients`, such as `local`), which never builds them — call `unpool` for
  /// them there.
  [[nodiscard]] matrix_view<const float> key_grads() const noexcept {
    return {grads_.data(), dim_ == 0 ? 0 : grads_.size() / dim_, dim_, dim_};
  }

 private:
  std::vector<float> rows_;
  std::vector<float> grads_;
  std::size_t dim_ = 0;
};

}  // namespace strata::embedding

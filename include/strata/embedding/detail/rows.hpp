/// @file rows.hpp
/// Internals shared by embedding storages: argument checks with clear messages and the
/// prefetching, row-parallel gather loop.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/embedding/concepts.hpp"

namespace strata::embedding::detail {

/// Rows looked ahead by the gather loops' software prefetch.
inline constexpr std::size_t prefetch_distance = 8;
/// Below this many floats a gather stays on the calling thread.
inline constexpr std::size_t parallel_floats = std::size_t{1} << 15;

/// Prefetches every cache line of a row of `dim` floats for reading. The empty `asm volatile`
/// keeps the prefetch: GCC deems a function (or lambda) whose only effect is __builtin_prefetch
/// `const` and deletes calls to it that it did not inline early.
inline void prefetch_row(const float* row, std::size_t dim) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  for (std::size_t c = 0; c < dim; c += 16)
    __builtin_prefetch(row + c, 0, 3);
  asm volatile("" : : "r"(row));
#else
  (void)row;
  (void)dim;
#endif
}

inline void check_table(std::string_view who, std::size_t table, std::size_t count) {
  if (table >= count)
    fail(errc::out_of_range, cat(who, ": table index ", table, " is outside [0, ", count,
                                 "); the storage was built with ", count, " table specs"));
}

/// Every key must be below spec.rows (when rows > 0).
inline void check_keys(std::string_view who, std::size_t table, const table_spec& spec,
                       std::span<const std::uint64_t> keys) {
  if (spec.rows == 0) return;
  std::uint64_t largest = 0;  // branch-free pass (vectorised); search only on failure
  for (const std::uint64_t k : keys)
    largest = std::max(largest, k);
  if (largest < spec.rows) [[likely]]
    return;
  const auto bad = std::find_if(keys.begin(), keys.end(),
                                [rows = spec.rows](std::uint64_t k) { return k >= rows; });
  if (bad != keys.end())
    fail(errc::out_of_range,
         cat(who, ": key ", *bad, " (position ", bad - keys.begin(), ") of table ", table, " '",
             spec.name, "' is outside its range [0, ", spec.rows,
             "); map raw ids into the table's rows (e.g. modulo) or use hash_table storage"));
}

inline void check_shape(std::string_view who, std::string_view what, std::size_t table,
                        const table_spec& spec, std::size_t rows, std::size_t expected_rows,
                        std::size_t cols) {
  if (rows != expected_rows || cols != spec.dim)
    fail(errc::size_mismatch,
         cat(who, ": ", what, " is ", rows, " x ", cols, " but table ", table, " '", spec.name,
             "' needs ", expected_rows, " x ", spec.dim, " (one row of dim values per key)"));
}

/// out.row(i) ← row_of(i) for i in [0, out.rows()), with software prefetch a few rows ahead,
/// in parallel over rows when large. `row_of(i)` returns `const float*` to `out.cols()` floats
/// and must be safe to call concurrently.
template <class RowOf>
void gather_rows(matrix_view<float> out, RowOf&& row_of) {
  const std::size_t n = out.rows();
  const std::size_t dim = out.cols();
  const auto body = [&](std::size_t first, std::size_t last) {
    for (std::size_t i = first; i < last; ++i) {
      if (i + prefetch_distance < last) prefetch_row(row_of(i + prefetch_distance), dim);
      const float* src = row_of(i);
      std::copy(src, src + dim, out.row(i).data());
    }
  };
  if (n * dim < parallel_floats) {
    body(0, n);
  } else {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 256),
                      [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); });
  }
}

}  // namespace strata::embedding::detail

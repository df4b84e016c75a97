/// @file concepts.hpp
/// The `storage` contract for embedding tables, wherever their rows live (this process, a
/// hash table, parameter servers).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "strata/core/matrix.hpp"
#include "strata/core/table_spec.hpp"

namespace strata::embedding {

using strata::table_spec;  ///< the shape of one table (core/table_spec.hpp)

/// Embedding storage holding `table_count()` tables.
///
/// - `gather(table, keys, out)`: `out.row(i)` ← row of `keys[i]` (`out` is keys.size() × dim).
///   Keys may repeat. A key outside a fixed table raises `errc::out_of_range` naming table,
///   key and range; a wrong `out` shape raises `errc::size_mismatch`.
/// - `apply_gradients(table, keys, grads)`: `grads.row(i)` is dLoss/d(row of keys[i]); rows of
///   equal keys are summed in ascending key order, then the storage's sparse optimizer updates
///   each touched row once (deterministic, no racing atomics).
/// - Calls on different tables may run concurrently; calls on one table are serialised by the
///   caller.
template <class S>
concept storage = requires(S& s, const S& cs, std::size_t table,
                           std::span<const std::uint64_t> keys, matrix_view<float> out,
                           matrix_view<const float> grads) {
  { cs.table_count() } -> std::convertible_to<std::size_t>;
  { cs.spec(table) } -> std::convertible_to<const table_spec&>;
  s.gather(table, keys, out);
  s.apply_gradients(table, keys, grads);
};

}  // namespace strata::embedding

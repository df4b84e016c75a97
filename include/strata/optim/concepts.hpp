/// @file concepts.hpp
/// The `sparse_optimizer` contract: how one embedding row is updated from its summed gradient.
/// Used by local tables (embedding/) and by parameter-server shards (ps/) alike, so an
/// optimizer gives the same result wherever the row lives.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>

#include "strata/core/error.hpp"

namespace strata::optim {

/// A row-wise sparse optimizer.
///
/// - `state_floats(dim)`: floats of optimizer state kept beside a row of `dim` weights
///   (SGD 0, Adagrad dim, Adam 2·dim + 1, FTRL 2·dim); zero-initialised when a row is created.
/// - `apply(row, state, grad)`: updates one row in place from the gradient summed over every
///   occurrence of its key in the step (callers sort keys and sum duplicates first, so the
///   result is deterministic). Pure function of (row, state, grad, hyper-parameters);
///   thread-safe for distinct rows.
/// - `name`: short name for logs and checkpoints.
template <class O>
concept sparse_optimizer = std::copy_constructible<O> &&
    requires(const O& o, std::span<float> row, std::span<float> state, std::span<const float> grad,
             std::size_t dim) {
  { O::name } -> std::convertible_to<const char*>;
  { O::state_floats(dim) } -> std::convertible_to<std::size_t>;
  o.apply(row, state, grad);
};

/// An optimizer that depends on the table (e.g. `table_groups`: FTRL for some tables, Adagrad
/// for the others): `name`, `state_floats(dim)` (enough for every table's optimizer) and
/// `visit(table, fn)`, which calls fn with the `sparse_optimizer` of that table.
template <class O>
concept per_table_optimizer = std::copy_constructible<O> && requires(const O& o, std::size_t dim) {
  { O::name } -> std::convertible_to<const char*>;
  { O::state_floats(dim) } -> std::convertible_to<std::size_t>;
  typename O::per_table_tag;
};

/// What a storage (local, hash_table, parameter-server shard) accepts for its tables.
template <class O>
concept table_optimizer = sparse_optimizer<O> || per_table_optimizer<O>;

/// The dense optimizer a storage's servers default to when none is given: the storage's own
/// (a `sparse_optimizer`), else `no_dense_optimizer` (a per-table optimizer has no meaning for
/// the dense parameters; a server only uses it for a `dense_table`, which then needs a real
/// one).
struct no_dense_optimizer {
  static constexpr const char* name = "none";
  [[nodiscard]] static constexpr std::size_t state_floats(std::size_t) noexcept { return 0; }
  void apply(std::span<float>, std::span<float>, std::span<const float>) const {
    fail(errc::invalid_argument,
         "optim::no_dense_optimizer: a dense table needs a dense optimizer of its own (a "
         "per-table optimizer such as table_groups cannot update it): pass DenseOptimizer");
  }
};
template <class O>
using default_dense_t = std::conditional_t<sparse_optimizer<O>, O, no_dense_optimizer>;

/// Calls fn(the optimizer of table `table`): `opt` itself for a `sparse_optimizer`, the table's
/// group's for a `per_table_optimizer`. Storages call it once per table update.
template <table_optimizer O, class Fn>
decltype(auto) with_table(const O& opt, std::size_t table, Fn&& fn) {
  if constexpr (sparse_optimizer<O>)
    return std::forward<Fn>(fn)(opt);
  else
    return opt.visit(table, std::forward<Fn>(fn));
}

}  // namespace strata::optim

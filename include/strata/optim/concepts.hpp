/// @file concepts.hpp
/// The `sparse_optimizer` contract: how one embedding row is updated from its summed gradient.
/// Used by local tables (embedding/) and by parameter-server shards (ps/) alike, so an
/// optimizer gives the same result wherever the row lives.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

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

}  // namespace strata::optim

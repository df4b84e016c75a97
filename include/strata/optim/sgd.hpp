/// @file sgd.hpp
/// Plain stochastic gradient descent for embedding rows.
#pragma once

#include <cstddef>
#include <span>

#include "strata/optim/concepts.hpp"

namespace strata::optim {

/// SGD: `row[c] -= lr * grad[c]`. No state (`state_floats(dim) == 0`).
/// Cost: one multiply-add per weight. Pure; thread-safe for distinct rows.
struct sgd {
  static constexpr const char* name = "sgd";
  float lr = 0.01f;  ///< learning rate

  static constexpr std::size_t state_floats(std::size_t /*dim*/) noexcept { return 0; }

  void apply(std::span<float> row, std::span<float> /*state*/,
             std::span<const float> grad) const noexcept {
    const std::size_t dim = row.size();
    float* w = row.data();
    const float* g = grad.data();
    for (std::size_t c = 0; c < dim; ++c)
      w[c] -= lr * g[c];
  }
};
static_assert(sparse_optimizer<sgd>);

}  // namespace strata::optim

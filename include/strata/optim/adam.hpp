/// @file adam.hpp
/// Lazy Adam (Kingma & Ba, 2015) for embedding rows: only rows present in a step are updated.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "strata/optim/concepts.hpp"

namespace strata::optim {

/// Lazy Adam: a row's moments decay only in the steps that touch it, and bias correction uses
/// the row's own step count t (kept in the row's state), as in TensorFlow's LazyAdam:
/// ```
/// t += 1;  m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
/// row -= lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + eps)
/// ```
/// State: `2·dim + 1` floats laid out [m (dim) | v (dim) | t]; t is exact up to 2^24 updates of
/// one row. Cost: two sqrt-free multiply-adds, one sqrt and one division per weight plus two
/// `pow` per row. Pure; thread-safe for distinct rows.
struct adam {
  static constexpr const char* name = "adam";
  float lr = 0.001f;     ///< learning rate
  float beta1 = 0.9f;    ///< decay of the first moment
  float beta2 = 0.999f;  ///< decay of the second moment
  float eps = 1e-8f;     ///< added to the corrected sqrt(v)

  static constexpr std::size_t state_floats(std::size_t dim) noexcept { return 2 * dim + 1; }

  void apply(std::span<float> row, std::span<float> state,
             std::span<const float> grad) const noexcept {
    const std::size_t dim = row.size();
    float* w = row.data();
    float* m = state.data();
    float* v = state.data() + dim;
    float& steps = state[2 * dim];
    steps += 1.0f;
    const double t = steps;
    const float correct1 = static_cast<float>(1.0 / (1.0 - std::pow(double{beta1}, t)));
    const float correct2 = static_cast<float>(1.0 / (1.0 - std::pow(double{beta2}, t)));
    const float* g = grad.data();
    for (std::size_t c = 0; c < dim; ++c) {
      m[c] = beta1 * m[c] + (1.0f - beta1) * g[c];
      v[c] = beta2 * v[c] + (1.0f - beta2) * g[c] * g[c];
      w[c] -= lr * (m[c] * correct1) / (std::sqrt(v[c] * correct2) + eps);
    }
  }
};
static_assert(sparse_optimizer<adam>);

}  // namespace strata::optim

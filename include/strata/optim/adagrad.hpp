/// @file adagrad.hpp
/// Adagrad (Duchi et al., 2011) for embedding rows, one accumulator per coordinate (as
/// torch.optim.Adagrad and FBGEMM's EXACT_ADAGRAD, not the row-wise variant).
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "strata/optim/concepts.hpp"

namespace strata::optim {

/// Adagrad with a per-coordinate accumulator:
/// `acc[c] += g[c]²;  row[c] -= lr * g[c] / (sqrt(acc[c]) + eps)`.
///
/// State: `dim` floats holding `acc - initial_accumulator`, so a freshly zeroed state means
/// `acc = initial_accumulator` (the storage contract zero-initialises state). Cost: one sqrt and
/// one division per weight. Pure; thread-safe for distinct rows.
struct adagrad {
  static constexpr const char* name = "adagrad";
  float lr = 0.01f;                  ///< learning rate
  float eps = 1e-10f;                ///< added to sqrt(acc) in the denominator
  float initial_accumulator = 0.0f;  ///< starting value of acc (TensorFlow uses 0.1)

  static constexpr std::size_t state_floats(std::size_t dim) noexcept { return dim; }

  void apply(std::span<float> row, std::span<float> state,
             std::span<const float> grad) const noexcept {
    const std::size_t dim = row.size();
    float* w = row.data();
    float* acc = state.data();
    const float* g = grad.data();
    for (std::size_t c = 0; c < dim; ++c) {
      acc[c] += g[c] * g[c];
      w[c] -= lr * g[c] / (std::sqrt(acc[c] + initial_accumulator) + eps);
    }
  }
};
static_assert(sparse_optimizer<adagrad>);

}  // namespace strata::optim

/// @file ftrl.hpp
/// FTRL-Proximal (McMahan et al., "Ad Click Prediction: a View from the Trenches", KDD 2013)
/// for embedding rows.
#pragma once

#include <cmath>
#include <cstddef>
#include <span>

#include "strata/optim/concepts.hpp"

namespace strata::optim {

/// FTRL-Proximal with per-coordinate z and n (Algorithm 1 of McMahan et al. 2013). For each
/// coordinate, with w the row's current weight (at which g was computed):
/// ```
/// σ = (sqrt(n + g²) − sqrt(n)) / α;  z += g − σ·w;  n += g²
/// w = 0                                           if |z| ≤ λ1
///   = −(z − sign(z)·λ1) / ((β + sqrt(n))/α + λ2)  otherwise
/// ```
/// The new weight is written into the row. As in the paper (and TensorFlow's FTRL), a row's
/// initial value only matters until its first update; after that the weight is a function of
/// (z, n). L1 makes weights exactly zero. State: `2·dim` floats laid out [z (dim) | n (dim)],
/// zero-initialised. Cost: two sqrt and one division per weight. Pure; thread-safe for distinct
/// rows.
struct ftrl {
  static constexpr const char* name = "ftrl";
  float alpha = 0.05f;  ///< learning-rate scale α
  float beta = 1.0f;    ///< learning-rate smoothing β
  float l1 = 0.0f;      ///< L1 strength λ1 (sparsity)
  float l2 = 0.0f;      ///< L2 strength λ2

  static constexpr std::size_t state_floats(std::size_t dim) noexcept { return 2 * dim; }

  void apply(std::span<float> row, std::span<float> state,
             std::span<const float> grad) const noexcept {
    const std::size_t dim = row.size();
    float* w = row.data();
    float* z = state.data();
    float* n = state.data() + dim;
    const float* g = grad.data();
    const float inv_alpha = 1.0f / alpha;
    for (std::size_t c = 0; c < dim; ++c) {
      const float n_new = n[c] + g[c] * g[c];
      const float sqrt_new = std::sqrt(n_new);
      const float sigma = (sqrt_new - std::sqrt(n[c])) * inv_alpha;
      z[c] += g[c] - sigma * w[c];
      n[c] = n_new;
      const float zc = z[c];
      w[c] = std::fabs(zc) <= l1
                 ? 0.0f
                 : -(zc - std::copysign(l1, zc)) / ((beta + sqrt_new) * inv_alpha + l2);
    }
  }
};
static_assert(sparse_optimizer<ftrl>);

}  // namespace strata::optim

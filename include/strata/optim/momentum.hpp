/// @file momentum.hpp
/// SGD with momentum and weight decay (the CIFAR ResNet recipe of He et al., 2016).
#pragma once

#include <cstddef>
#include <span>

#include "strata/optim/concepts.hpp"

namespace strata::optim {

/// Heavy-ball momentum with L2 weight decay folded into the gradient, as PyTorch's
/// `torch.optim.SGD(momentum, weight_decay)` computes it:
/// ```
/// v = momentum·v + (g + weight_decay·w);   w -= lr·v
/// ```
/// State: `dim` floats (the velocity), zero at the start. Meant for dense parameters (every
/// value is updated every step); on embedding rows it is "lazy" (a row's velocity decays only
/// in the steps that touch it). Pure; thread-safe for distinct rows.
struct momentum {
  static constexpr const char* name = "momentum";
  float lr = 0.1f;             ///< learning rate
  float beta = 0.9f;           ///< momentum (the velocity's decay)
  float weight_decay = 5e-4f;  ///< L2 penalty, added to the gradient

  static constexpr std::size_t state_floats(std::size_t dim) noexcept { return dim; }

  void apply(std::span<float> row, std::span<float> state,
             std::span<const float> grad) const noexcept {
    const std::size_t dim = row.size();
    float* w = row.data();
    float* v = state.data();
    const float* g = grad.data();
    for (std::size_t c = 0; c < dim; ++c) {
      v[c] = beta * v[c] + (g[c] + weight_decay * w[c]);
      w[c] -= lr * v[c];
    }
  }
};
static_assert(sparse_optimizer<momentum>);

}  // namespace strata::optim

/// @file loss.hpp
/// Binary cross-entropy on logits, numerically stable for any finite logit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

#include "strata/core/error.hpp"
#include "strata/nn/activations.hpp"

namespace strata::nn {

/// How a loss over a batch is reduced.
enum class reduction { sum, mean };

/// Binary cross-entropy with logits, per sample
/// `ℓ(l, y) = max(l, 0) − l·y + log1p(exp(−|l|))` (= −y·log σ(l) − (1−y)·log(1−σ(l)), with no
/// overflow or log(0) for any finite l). Returns Σℓ (reduction::sum) or Σℓ / n
/// (reduction::mean), accumulated in double in index order (deterministic).
///
/// When `dlogits` is not empty it receives `dlogits[i] = (σ(l_i) − y_i) · grad_scale`. The scale
/// is the caller's choice and is independent of `r`: pass 1/global_batch on every worker so the
/// workers' gradients sum to the gradient of the global-batch mean loss.
/// Labels are expected in [0, 1] (soft labels allowed). Cost: one exp and one log1p per
/// sample. Stateless; thread-safe.
inline double bce_with_logits(std::span<const float> logits, std::span<const float> labels,
                              std::span<float> dlogits, float grad_scale,
                              reduction r = reduction::mean) {
  if (labels.size() != logits.size())
    fail(errc::size_mismatch, cat("bce_with_logits: ", labels.size(), " labels for ", logits.size(),
                                  " logits; pass one label per sample"));
  if (!dlogits.empty() && dlogits.size() != logits.size())
    fail(errc::size_mismatch, cat("bce_with_logits: dlogits has ", dlogits.size(), " values for ",
                                  logits.size(), " logits; pass one per sample or an empty span"));
  double total = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double l = logits[i];
    const double y = labels[i];
    total += std::max(l, 0.0) - l * y + std::log1p(std::exp(-std::abs(l)));
    if (!dlogits.empty()) dlogits[i] = (sigmoid::value(logits[i]) - labels[i]) * grad_scale;
  }
  if (r == reduction::mean && !logits.empty()) total /= static_cast<double>(logits.size());
  return total;
}

/// The loss alone (no gradient).
inline double bce_with_logits(std::span<const float> logits, std::span<const float> labels,
                              reduction r = reduction::mean) {
  return bce_with_logits(logits, labels, {}, 0.0f, r);
}

}  // namespace strata::nn

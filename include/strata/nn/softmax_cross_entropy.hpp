/// @file softmax_cross_entropy.hpp
/// Multi-class cross-entropy on logits (log-softmax computed stably), with its gradient.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <span>
#include <type_traits>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/loss.hpp"

namespace strata::nn {

/// Softmax cross-entropy of logits `z` (batch × K) against integer class labels:
/// `ℓ_i = logsumexp(z_i) − z_i[y_i]`, with the row maximum subtracted first (no overflow for
/// any finite logit). Returns Σℓ (reduction::sum) or Σℓ / batch (reduction::mean), accumulated
/// in double in row order (deterministic).
///
/// When `dlogits` is not empty (batch × K) it receives
/// `dlogits[i, k] = (softmax(z_i)[k] − [k = y_i]) · grad_scale`, the scale being the caller's
/// choice, independent of `r` (pass 1/global_batch on every worker so the workers' gradients
/// sum to the gradient of the global-batch mean loss). A label outside [0, K) raises
/// `errc::out_of_range` naming the row. Cost: K exps per row. Stateless; thread-safe.
template <std::integral Label>
double softmax_cross_entropy(matrix_view<const float> logits, std::span<const Label> labels,
                             matrix_view<float> dlogits, float grad_scale,
                             reduction r = reduction::mean) {
  const std::size_t n = logits.rows(), k = logits.cols();
  if (labels.size() != n)
    fail(errc::size_mismatch, cat("softmax_cross_entropy: ", labels.size(), " labels for ", n,
                                  " rows of logits; pass one label per sample"));
  STRATA_EXPECTS(k > 0, "softmax_cross_entropy: logits need at least one class column");
  const bool want_grad = dlogits.rows() != 0 || dlogits.cols() != 0;
  if (want_grad) detail::expect_shape("softmax_cross_entropy", "dlogits", dlogits, n, k);
  double total = 0.0;
  for (std::size_t i = 0; i < n; ++i) {
    const auto label = labels[i];
    bool negative = false;
    if constexpr (std::is_signed_v<Label>) negative = label < 0;
    if (negative || static_cast<std::size_t>(label) >= k)
      fail(errc::out_of_range,
           cat("softmax_cross_entropy: label[", i, "] = ", +label, " is not a class 0..", k - 1));
    const auto z = logits.row(i);
    const double top = *std::max_element(z.begin(), z.end());
    double sum = 0.0;
    for (std::size_t c = 0; c < k; ++c)
      sum += std::exp(static_cast<double>(z[c]) - top);
    total += std::log(sum) - (static_cast<double>(z[static_cast<std::size_t>(label)]) - top);
    if (want_grad) {
      const auto d = dlogits.row(i);
      const double inv = 1.0 / sum;
      for (std::size_t c = 0; c < k; ++c)
        d[c] = static_cast<float>(std::exp(static_cast<double>(z[c]) - top) * inv) * grad_scale;
      d[static_cast<std::size_t>(label)] -= grad_scale;
    }
  }
  if (r == reduction::mean && n > 0) total /= static_cast<double>(n);
  return total;
}

/// The loss alone (no gradient).
template <std::integral Label>
double softmax_cross_entropy(matrix_view<const float> logits, std::span<const Label> labels,
                             reduction r = reduction::mean) {
  return softmax_cross_entropy(logits, labels, matrix_view<float>{}, 0.0f, r);
}

}  // namespace strata::nn

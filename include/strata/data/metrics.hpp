/// @file metrics.hpp
/// Evaluation metrics for binary CTR prediction (exact AUC, log loss, accuracy) and for
/// multi-class classification (arg-max accuracy).
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <ranges>
#include <span>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"

namespace strata::data {

namespace detail {
template <class S>
void check_binary(const char* what, std::span<const S> scores, std::span<const float> labels) {
  if (scores.size() != labels.size())
    fail(errc::size_mismatch, cat(what, ": ", scores.size(), " scores but ", labels.size(),
                                  " labels; pass one score per label"));
  for (std::size_t i = 0; i < labels.size(); ++i) {
    STRATA_EXPECTS(labels[i] == 0.0f || labels[i] == 1.0f, what, ": label[", i, "] = ", labels[i],
                   " is not 0 or 1");
    STRATA_EXPECTS(!std::isnan(scores[i]), what, ": score[", i, "] is NaN");
  }
}
}  // namespace detail

/// A contiguous range of float or double scores (std::vector, std::span, std::array, …).
template <class R>
concept scores_range = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
    std::floating_point<std::ranges::range_value_t<R>>;

/// Exact area under the ROC curve: the probability that a random positive scores above a
/// random negative, ties counting 1/2 (the Mann–Whitney U statistic divided by P·N). Computed
/// from average ranks after one sort: O(n log n) time, O(n) memory. Scores may be
/// probabilities or logits (only their order matters). Labels must be 0 or 1, scores not NaN,
/// and both classes present (otherwise AUC is undefined: `errc::invalid_argument`).
/// Thread-safe (pure function).
template <scores_range R>
[[nodiscard]] double auc(const R& scores_in, std::span<const float> labels) {
  const std::span<const std::ranges::range_value_t<R>> scores(scores_in);
  detail::check_binary("auc", scores, labels);
  const std::size_t n = scores.size();
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::sort(order.begin(), order.end(),
            [&](std::size_t a, std::size_t b) { return scores[a] < scores[b]; });
  double positive_rank_sum = 0;  // 1-based ranks, ties averaged
  std::size_t positives = 0;
  for (std::size_t i = 0; i < n;) {
    std::size_t j = i;
    std::size_t tied_positives = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) {
      tied_positives += labels[order[j]] == 1.0f ? 1 : 0;
      ++j;
    }
    const double mean_rank = 0.5 * static_cast<double>(i + 1 + j);  // mean of i+1 … j
    positive_rank_sum += mean_rank * static_cast<double>(tied_positives);
    positives += tied_positives;
    i = j;
  }
  const std::size_t negatives = n - positives;
  STRATA_EXPECTS(positives > 0 && negatives > 0, "auc: needs both classes, got ", positives,
                 " positives and ", negatives, " negatives; evaluate on a larger set");
  const double p = static_cast<double>(positives);
  return (positive_rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(negatives));
}

/// Mean binary cross-entropy −[y log p + (1 − y) log(1 − p)] of probabilities `probs`, each
/// clipped to [eps, 1 − eps]; O(n), accumulated in double. Thread-safe.
template <scores_range R>
[[nodiscard]] double logloss(const R& probs_in, std::span<const float> labels, double eps = 1e-7) {
  const std::span<const std::ranges::range_value_t<R>> probs(probs_in);
  detail::check_binary("logloss", probs, labels);
  STRATA_EXPECTS(!probs.empty(), "logloss: no examples");
  double sum = 0;
  for (std::size_t i = 0; i < probs.size(); ++i) {
    const double p = std::clamp(static_cast<double>(probs[i]), eps, 1 - eps);
    sum -= labels[i] == 1.0f ? std::log(p) : std::log1p(-p);
  }
  return sum / static_cast<double>(probs.size());
}

/// Mean binary cross-entropy of logits z (p = sigmoid(z)), computed stably as
/// max(z, 0) − z·y + log(1 + exp(−|z|)); O(n). Thread-safe.
template <scores_range R>
[[nodiscard]] double logloss_from_logits(const R& logits_in, std::span<const float> labels) {
  const std::span<const std::ranges::range_value_t<R>> logits(logits_in);
  detail::check_binary("logloss_from_logits", logits, labels);
  STRATA_EXPECTS(!logits.empty(), "logloss_from_logits: no examples");
  double sum = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double z = logits[i];
    sum += std::max(z, 0.0) - z * labels[i] + std::log1p(std::exp(-std::abs(z)));
  }
  return sum / static_cast<double>(logits.size());
}

/// Fraction of examples with (score ≥ threshold) == (label == 1); O(n). Use threshold 0.5 for
/// probabilities, 0 for logits. Thread-safe.
template <scores_range R>
[[nodiscard]] double accuracy(const R& scores_in, std::span<const float> labels,
                              double threshold = 0.5) {
  const std::span<const std::ranges::range_value_t<R>> scores(scores_in);
  detail::check_binary("accuracy", scores, labels);
  STRATA_EXPECTS(!scores.empty(), "accuracy: no examples");
  std::size_t right = 0;
  for (std::size_t i = 0; i < scores.size(); ++i)
    right += (scores[i] >= threshold) == (labels[i] == 1.0f) ? 1 : 0;
  return static_cast<double>(right) / static_cast<double>(scores.size());
}

/// Multi-class accuracy: fraction of rows whose arg-max column (first on ties) equals the
/// label; `logits` is n × classes. O(n · classes). Thread-safe.
template <std::ranges::contiguous_range R>
requires std::integral<std::ranges::range_value_t<R>>
[[nodiscard]] double argmax_accuracy(matrix_view<const float> logits, const R& labels_in) {
  const std::span<const std::ranges::range_value_t<R>> labels(labels_in);
  if (logits.rows() != labels.size())
    fail(errc::size_mismatch,
         cat("argmax_accuracy: ", logits.rows(), " rows of logits but ", labels.size(), " labels"));
  STRATA_EXPECTS(logits.rows() > 0 && logits.cols() > 0, "argmax_accuracy: no examples");
  std::size_t right = 0;
  for (std::size_t r = 0; r < logits.rows(); ++r) {
    const auto row = logits.row(r);
    const auto best =
        static_cast<std::size_t>(std::max_element(row.begin(), row.end()) - row.begin());
    STRATA_EXPECTS(labels[r] >= 0 && static_cast<std::size_t>(labels[r]) < logits.cols(),
                   "argmax_accuracy: label[", r, "] = ", +labels[r], " outside 0..",
                   logits.cols() - 1);
    right += best == static_cast<std::size_t>(labels[r]) ? 1 : 0;
  }
  return static_cast<double>(right) / static_cast<double>(logits.rows());
}

}  // namespace strata::data

/// @file evaluation.hpp
/// Scores of a CTR model's predictions on a held-out set: AUC, logloss and accuracy.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/data/metrics.hpp"
#include "strata/train/options.hpp"

namespace strata::train {

/// Scores `logits` against 0/1 `labels` after `step` steps: AUC (0.5 when the labels hold one
/// class only: AUC is undefined there), logloss of the logits, accuracy at probability 0.5.
inline eval_point score_predictions(std::span<const float> logits, std::span<const float> labels,
                                    std::size_t step) {
  STRATA_EXPECTS(logits.size() == labels.size(), "score_predictions: ", logits.size(),
                 " predictions for ", labels.size(), " labels");
  eval_point point;
  point.step = step;
  point.samples = logits.size();
  if (logits.empty()) return point;
  std::vector<float> probs(logits.size());
  std::transform(logits.begin(), logits.end(), probs.begin(),
                 [](float l) { return 1.0f / (1.0f + std::exp(-l)); });
  const auto positives = std::count(labels.begin(), labels.end(), 1.0f);
  point.auc = positives > 0 && positives < static_cast<std::ptrdiff_t>(labels.size())
                  ? data::auc(logits, labels)
                  : 0.5;
  point.logloss = data::logloss_from_logits(logits, labels);
  point.accuracy = data::accuracy(probs, labels);
  return point;
}

}  // namespace strata::train

/// @file evaluation.hpp
/// Scores of a CTR model's predictions on a held-out set (AUC, logloss, accuracy), and the
/// checksums reports carry to compare runs bitwise (threads against MPI, strategy against
/// strategy).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/rng.hpp"
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

namespace detail {
/// Order-independent checksum of rows: wrapping sum of a hash of (table, key, bits of row).
inline std::uint64_t row_hash(std::size_t table, std::uint64_t key, std::span<const float> row) {
  std::uint64_t h = mix_ids(table + 1, key);
  for (float v : row)
    h = mix_ids(h, std::bit_cast<std::uint32_t>(v));
  return h;
}
inline std::uint64_t values_checksum(std::span<const float> values) {
  std::uint64_t h = 0x5354524154410000ull;
  for (float v : values)
    h = mix_ids(h, std::bit_cast<std::uint32_t>(v));
  return h;
}
}  // namespace detail

}  // namespace strata::train

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
#include <numeric>
#include <optional>
#include <span>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/progress.hpp"
#include "strata/core/rng.hpp"
#include "strata/data/batch.hpp"
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

/// Scores `predict` on the first `max_samples` rows of `set` (0: all), in batches of `batch`
/// rows in file order, and logs the scores as "eval @ step N: …". `predict(rows, logits)`
/// writes one logit per row of the gathered `rows` (a data::ctr_batch); `scratch` is reused.
template <class Predict>
eval_point evaluate(const data::example_source& set, std::size_t batch, std::size_t max_samples,
                    std::size_t at_step, data::ctr_batch& scratch, Predict&& predict) {
  STRATA_EXPECTS(batch > 0, "evaluate: the batch size must be positive");
  const std::size_t count = max_samples == 0 ? set.size() : std::min(set.size(), max_samples);
  std::vector<float> logits(count), labels;
  labels.reserve(count);
  std::vector<std::size_t> indices;
  for (std::size_t first = 0; first < count; first += batch) {
    const std::size_t n = std::min(batch, count - first);
    indices.resize(n);
    std::iota(indices.begin(), indices.end(), first);
    set.gather(indices, scratch);
    set.done_with(first, first + n);
    predict(scratch, std::span<float>(logits).subspan(first, n));
    labels.insert(labels.end(), scratch.labels.begin(), scratch.labels.end());
  }
  const eval_point point = score_predictions(logits, labels, at_step);
  log_line(cat("eval @ step ", at_step, ": auc ", point.auc, " logloss ", point.logloss,
               " accuracy ", point.accuracy, " (", count, " samples)"));
  return point;
}

/// A worker's running figures over one training segment: the summed loss of its batches and
/// their logits and labels (the train AUC).
struct training_metrics {
  void reset() {
    loss_sum = 0;
    loss_count = 0;
    logits.clear();
    labels.clear();
  }
  /// One batch: its summed loss and its rows' logits and labels.
  void add(double batch_loss, std::span<const float> batch_logits,
           std::span<const float> batch_labels) {
    loss_sum += batch_loss;
    loss_count += batch_logits.size();
    logits.insert(logits.end(), batch_logits.begin(), batch_logits.end());
    labels.insert(labels.end(), batch_labels.begin(), batch_labels.end());
  }
  /// Mean loss per row (0 before any batch).
  [[nodiscard]] double mean_loss() const noexcept {
    return loss_count == 0 ? 0.0 : loss_sum / static_cast<double>(loss_count);
  }
  /// AUC of the segment's rows; none while the labels hold one class only.
  [[nodiscard]] std::optional<double> auc() const {
    const auto positives = std::count(labels.begin(), labels.end(), 1.0f);
    if (positives == 0 || positives == static_cast<std::ptrdiff_t>(labels.size()))
      return std::nullopt;
    return data::auc(logits, labels);
  }

  double loss_sum = 0;
  std::size_t loss_count = 0;
  std::vector<float> logits, labels;
};

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

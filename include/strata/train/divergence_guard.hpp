/// @file divergence_guard.hpp
/// The trainer's divergence guard: what of a step is not finite (before anything of it leaves
/// the worker), and a warning when the step loss blows up against its running mean.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/finite.hpp"
#include "strata/core/matrix.hpp"
#include "strata/core/progress.hpp"
#include "strata/core/table_spec.hpp"
#include "strata/train/options.hpp"

namespace strata::train {

/// One worker's guard. `first_non_finite` is stateless; `observe` keeps the running mean of the
/// per-sample step loss (exponential, weight 0.05) that the blow-up warning compares against.
class divergence_guard {
 public:
  /// `warn_factor` = 0 turns the warning off; otherwise a step loss above warn_factor × the
  /// running mean is reported, after `warmup` steps and at most once per `quiet` steps.
  explicit divergence_guard(double warn_factor, std::size_t warmup = 20, std::size_t quiet = 100)
      : warn_factor_(warn_factor), warmup_(warmup), quiet_(quiet) {}

  /// What of one step is not finite, in the order it is checked — "the loss is nan", "dense
  /// gradient 12 is inf", "the gradient of table 3 ('C4') row of key 77 is nan" — or empty.
  /// `keys[t]` are table t's keys and `row_grads[t]` their gradients (one row per key).
  [[nodiscard]] static std::string first_non_finite(
      double loss, std::span<const float> dense_grads, std::span<const table_spec> tables,
      std::span<const std::vector<std::uint64_t>> keys, std::span<const matrix<float>> row_grads) {
    if (!std::isfinite(loss)) return cat("the loss is ", loss);
    if (const std::size_t at = strata::detail::first_non_finite(dense_grads);
        at < dense_grads.size())
      return cat("dense gradient ", at, " is ", dense_grads[at]);
    for (std::size_t t = 0; t < tables.size() && t < row_grads.size(); ++t) {
      const auto& g = row_grads[t];
      const std::span<const float> values(g.data(), g.rows() * g.cols());
      if (const std::size_t bad = strata::detail::first_non_finite(values); bad < values.size())
        return cat("the gradient of table ", t, " ('", tables[t].name, "') row of key ",
                   keys[t][bad / g.cols()], " is ", values[bad]);
    }
    return {};
  }

  /// Takes step `step`'s per-sample loss into the running mean; returns the warning line when
  /// it is above warn_factor × the mean so far (after the warm-up, not within `quiet` steps of
  /// the last warning).
  std::optional<std::string> observe(double per_sample_loss, std::size_t step) {
    std::optional<std::string> warning;
    if (warn_factor_ > 0 && steps_ >= warmup_ && per_sample_loss > warn_factor_ * average_ &&
        (!warned_ || step >= warned_step_ + quiet_)) {
      warned_ = true;
      warned_step_ = step;
      warning = cat("warning: step ", step + 1, " loss ", per_sample_loss, " is ",
                    per_sample_loss / average_, "x its running mean ", average_,
                    " - the run may be diverging (lower --lr?)");
    }
    average_ = steps_ == 0 ? per_sample_loss : 0.95 * average_ + 0.05 * per_sample_loss;
    ++steps_;
    return warning;
  }

  [[nodiscard]] double running_mean() const noexcept { return average_; }

 private:
  double warn_factor_;
  std::size_t warmup_, quiet_;
  double average_ = 0;
  std::size_t steps_ = 0;
  bool warned_ = false;
  std::size_t warned_step_ = 0;
};

/// What one worker does with the guard's findings, step by step (trainer_options'
/// divergence_guard, on_divergence and blowup_warn_factor): a non-finite step stops the run
/// (errc::diverged naming the step, the worker, the tensor and the last good checkpoint), or
/// under divergence_policy::skip_batch drops the batch — logged (the first 10, then every
/// 100th) and counted — until `max_in_a_row` consecutive drops, which stop as `stop` does (the
/// model itself is no longer finite); a finite step's loss feeds the blow-up warning (logged
/// by worker 0).
class divergence_response {
 public:
  static constexpr std::size_t max_in_a_row = 10;

  divergence_response(divergence_policy policy, double warn_factor, int worker)
      : policy_(policy), guard_(warn_factor), worker_(worker) {}

  /// Step `step` (0-based) with `what` = first_non_finite's finding (empty: finite) and
  /// `per_sample_loss`: returns true when its batch is dropped (the caller zeroes its
  /// gradients so that nothing non-finite leaves the worker); throws errc::diverged to stop.
  /// `last_good()` gives the sentence naming the checkpoint to resume from.
  template <class LastGood>
  bool drop(const std::string& what, double per_sample_loss, std::size_t step,
            LastGood&& last_good) {
    if (!what.empty() && policy_ == divergence_policy::skip_batch && in_a_row_ + 1 < max_in_a_row) {
      ++in_a_row_;
      ++skipped_;
      if (skipped_ <= 10 || skipped_ % 100 == 0)
        log_line(cat("step ", step + 1, " on worker ", worker_, ": ", what,
                     "; its batch is dropped (zero gradients), ", skipped_,
                     " dropped on this worker so far"));
      return true;
    }
    if (!what.empty())
      fail(errc::diverged,
           cat("training diverged at step ", step + 1, " on worker ", worker_, ": ", what,
               "; nothing of this step left the worker. ",
               in_a_row_ > 0 ? cat("The ", in_a_row_,
                                   " batches before it were dropped too (--on-divergence skip): "
                                   "the model itself is no longer finite. ")
                             : std::string(),
               last_good(), " Lower the learning rate (--lr) or check the input data"));
    in_a_row_ = 0;
    const auto warning = guard_.observe(per_sample_loss, step);
    if (warning && worker_ == 0) log_line(*warning);
    return false;
  }

  /// Batches dropped so far.
  [[nodiscard]] std::size_t skipped() const noexcept { return skipped_; }

 private:
  divergence_policy policy_;
  divergence_guard guard_;
  int worker_;
  std::size_t skipped_ = 0;   ///< batches dropped
  std::size_t in_a_row_ = 0;  ///< the latest steps' drops, consecutive
};

}  // namespace strata::train

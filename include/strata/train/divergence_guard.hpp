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
#include "strata/core/table_spec.hpp"

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

}  // namespace strata::train

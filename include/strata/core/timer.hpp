/// @file timer.hpp
/// Wall-clock stopwatch and named time accumulators for step breakdowns.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>

#include "strata/core/trace.hpp"

namespace strata {

/// Measures elapsed wall time from construction or the last restart(). Not thread-safe.
class stopwatch {
 public:
  using clock = std::chrono::steady_clock;
  stopwatch() noexcept : start_(clock::now()) {}
  void restart() noexcept { start_ = clock::now(); }
  [[nodiscard]] double seconds() const noexcept {
    return std::chrono::duration<double>(clock::now() - start_).count();
  }
  /// Seconds since the last lap (or start), and starts a new lap.
  double lap() noexcept {
    const auto now = clock::now();
    const double s = std::chrono::duration<double>(now - start_).count();
    start_ = now;
    return s;
  }

 private:
  clock::time_point start_;
};

/// Seconds spent in each of `N` phases of a loop (e.g. data, pull, compute, allreduce, push),
/// and, when given a trace_recorder, each phase as a span on its timeline (trace.hpp).
/// Not thread-safe: one per thread.
template <std::size_t N>
class phase_timer {
 public:
  using clock = std::chrono::steady_clock;

  /// Adds the time since the previous mark (or construction/reset) to phase `phase` (and
  /// records it as a span named names[phase] when tracing).
  void mark(std::size_t phase) {
    const auto now = clock::now();
    seconds_[phase] += std::chrono::duration<double>(now - last_).count();
    if (trace_ != nullptr) trace_->span(names_[phase], last_, now);
    last_ = now;
  }
  /// Discards the time since the previous mark.
  void skip() noexcept { last_ = clock::now(); }
  [[nodiscard]] double seconds(std::size_t phase) const noexcept { return seconds_[phase]; }
  [[nodiscard]] double total() const noexcept {
    double sum = 0;
    for (double s : seconds_)
      sum += s;
    return sum;
  }
  void reset() noexcept {
    seconds_ = {};
    last_ = clock::now();
  }
  /// Records every later mark as a span of `names[phase]` into `trace` (nullptr: stop).
  void trace_into(trace_recorder* trace, const std::array<const char*, N>& names) noexcept {
    trace_ = trace;
    names_ = names;
  }

 private:
  std::array<double, N> seconds_{};
  clock::time_point last_ = clock::now();
  trace_recorder* trace_ = nullptr;
  std::array<const char*, N> names_{};
};

}  // namespace strata

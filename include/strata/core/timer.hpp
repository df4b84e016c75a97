/// @file timer.hpp
/// Wall-clock stopwatch and named time accumulators for step breakdowns.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>

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

/// Seconds spent in each of `N` phases of a loop (e.g. data, pull, compute, allreduce, push).
/// Not thread-safe: one per thread.
template <std::size_t N>
class phase_timer {
 public:
  /// Adds the time since the previous mark (or construction/reset) to phase `phase`.
  void mark(std::size_t phase) noexcept { seconds_[phase] += watch_.lap(); }
  /// Discards the time since the previous mark.
  void skip() noexcept { watch_.lap(); }
  [[nodiscard]] double seconds(std::size_t phase) const noexcept { return seconds_[phase]; }
  [[nodiscard]] double total() const noexcept {
    double sum = 0;
    for (double s : seconds_)
      sum += s;
    return sum;
  }
  void reset() noexcept {
    seconds_ = {};
    watch_.restart();
  }

 private:
  std::array<double, N> seconds_{};
  stopwatch watch_;
};

}  // namespace strata

/// @file progress.hpp
/// Progress and log lines on stderr: rate-limited; on a terminal one live line with rate and
/// ETA, redrawn in place; otherwise plain lines at a slower pace (logs stay readable).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

#include "strata/core/timer.hpp"

namespace strata {

namespace detail {
/// snprintf into a std::string of the needed length (no truncation of long labels).
template <class... Args>
std::string printf_string(const char* format, Args... args) {
  const int length = std::snprintf(nullptr, 0, format, args...);
  if (length <= 0) return {};
  std::string text(static_cast<std::size_t>(length), '\0');
  std::snprintf(text.data(), text.size() + 1, format, args...);
  return text;
}
}  // namespace detail

/// Writes one line to stderr (whole lines only, safe from several threads).
inline void log_line(std::string_view line) {
  static std::mutex guard;
  std::lock_guard lock(guard);
  std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
  std::fflush(stderr);
}

/// Formats seconds as "1h02m", "3m05s" or "4.2s".
inline std::string format_duration(double seconds) {
  char text[32];
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  if (seconds >= 3600)
    std::snprintf(text, sizeof text, "%dh%02dm", static_cast<int>(seconds / 3600),
                  static_cast<int>(seconds / 60) % 60);
  else if (seconds >= 60)
    std::snprintf(text, sizeof text, "%dm%02ds", static_cast<int>(seconds / 60),
                  static_cast<int>(seconds) % 60);
  else
    std::snprintf(text, sizeof text, "%.1fs", seconds);
  return text;
}

/// A progress line for `total` units of work (0 = unknown total: no ETA).
/// update() is cheap when called often: it prints at most every `interval` seconds
/// (0.2 s on a terminal, 5 s otherwise unless given). Not thread-safe: one owner thread.
class progress {
 public:
  explicit progress(std::string label, std::uint64_t total = 0, std::string unit = "it",
                    double interval_seconds = -1)
      : label_(std::move(label)),
        unit_(std::move(unit)),
        total_(total),
        tty_(isatty(fileno(stderr)) != 0),
        interval_(interval_seconds >= 0 ? interval_seconds : (tty_ ? 0.2 : 5.0)) {}
  progress(const progress&) = delete;
  progress& operator=(const progress&) = delete;
  ~progress() {
    if (tty_ && drawn_) std::fputc('\n', stderr);
  }

  /// Reports `done` units finished; `detail` is appended (e.g. "loss 0.45").
  void update(std::uint64_t done, std::string_view detail = {}) {
    done_ = done;
    const double now = clock_.seconds();
    if (now - last_print_ < interval_ && !(total_ != 0 && done >= total_)) return;
    last_print_ = now;
    print(detail);
  }
  /// Prints the final state once, whatever the rate limit.
  void finish(std::string_view detail = {}) {
    print(detail);
    if (tty_) std::fputc('\n', stderr);
    drawn_ = false;
  }
  [[nodiscard]] bool is_terminal() const noexcept { return tty_; }
  [[nodiscard]] double elapsed() const noexcept { return clock_.seconds(); }

  /// The line as it would be printed now (without terminal control characters).
  [[nodiscard]] std::string line(std::string_view detail = {}) const {
    const double elapsed = clock_.seconds();
    const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
    std::string text;
    if (total_ != 0) {
      const double eta =
          rate > 0 ? static_cast<double>(total_ - std::min(done_, total_)) / rate : -1;
      text = detail::printf_string(
          "%s %llu/%llu (%3.0f%%) %.1f %s/s elapsed %s eta %s", label_.c_str(),
          static_cast<unsigned long long>(done_), static_cast<unsigned long long>(total_),
          100.0 * static_cast<double>(done_) / static_cast<double>(total_), rate, unit_.c_str(),
          format_duration(elapsed).c_str(), format_duration(eta).c_str());
    } else {
      text = detail::printf_string("%s %llu %.1f %s/s elapsed %s", label_.c_str(),
                                   static_cast<unsigned long long>(done_), rate, unit_.c_str(),
                                   format_duration(elapsed).c_str());
    }
    if (!detail.empty()) {
      text += "  ";
      text += detail;
    }
    return text;
  }

 private:
  void print(std::string_view detail) {
    const std::string text = line(detail);
    if (tty_) {
      std::fprintf(stderr, "\r\033[2K%s", text.c_str());
      std::fflush(stderr);
      drawn_ = true;
    } else {
      log_line(text);
    }
  }

  std::string label_;
  std::string unit_;
  std::uint64_t total_;
  std::uint64_t done_ = 0;
  bool tty_;
  bool drawn_ = false;
  double interval_;
  double last_print_ = -1e300;
  stopwatch clock_;
};

}  // namespace strata

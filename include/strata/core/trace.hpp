/// @file trace.hpp
/// A timeline of what each rank did, written as a Chrome / Perfetto trace (the JSON "trace
/// event format": open the file at ui.perfetto.dev or chrome://tracing). `trace_recorder` is
/// one rank's buffer — complete spans ("ph":"X": a name, a start and a duration) and counter
/// samples ("ph":"C", e.g. bytes sent so far) — filled by one thread without locks;
/// `write_trace` turns several recorders into one file, a track per rank.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"

namespace strata {

/// One rank's events. Times are microseconds since a shared origin (`trace_recorder::origin`,
/// taken when the first recorder of a process is made), so the tracks of one process line
/// up. Span and counter names must outlive the recorder (string literals). At most `capacity`
/// events are kept; later ones are counted in `dropped()` (the file says so). Not thread-safe:
/// one recorder per thread.
class trace_recorder {
 public:
  using clock = std::chrono::steady_clock;

  struct event {
    const char* name = nullptr;
    double start_us = 0;     ///< span start, or the counter's sample time
    double duration_us = 0;  ///< spans only
    double value = 0;        ///< counters only
    bool counter = false;
  };

  /// `track`: the rank (a track per rank); `label`: its name in the viewer ("worker 0").
  trace_recorder(int track, std::string label, std::size_t capacity = std::size_t{1} << 20)
      : track_(track), label_(std::move(label)), capacity_(capacity) {
    STRATA_EXPECTS(capacity > 0, "trace_recorder: capacity must be positive");
  }

  /// Microseconds from the process's trace origin to `t`.
  [[nodiscard]] static double micros(clock::time_point t) noexcept {
    return std::chrono::duration<double, std::micro>(t - origin()).count();
  }
  /// The process's trace origin (the first call's time).
  static clock::time_point origin() noexcept {
    static const clock::time_point start = clock::now();
    return start;
  }

  /// A span `name` from `begin` to `end`.
  void span(const char* name, clock::time_point begin, clock::time_point end) {
    const double b = micros(begin);
    add({name, b, micros(end) - b, 0, false});
  }
  /// A sample of counter `name` at `at`.
  void count(const char* name, double value, clock::time_point at = clock::now()) {
    add({name, micros(at), 0, value, true});
  }

  [[nodiscard]] int track() const noexcept { return track_; }
  [[nodiscard]] const std::string& label() const noexcept { return label_; }
  [[nodiscard]] std::span<const event> events() const noexcept { return events_; }
  [[nodiscard]] std::size_t dropped() const noexcept { return dropped_; }

 private:
  void add(const event& e) {
    if (events_.size() < capacity_)
      events_.push_back(e);
    else
      ++dropped_;
  }

  int track_;
  std::string label_;
  std::size_t capacity_;
  std::vector<event> events_;
  std::size_t dropped_ = 0;
};

namespace detail {
/// `text` as a JSON string literal (quotes, backslashes and control characters escaped).
inline std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char code[8];
      std::snprintf(code, sizeof code, "\\u%04x", static_cast<unsigned>(c));
      out += code;
    } else {
      out += c;
    }
  }
  return out + "\"";
}
}  // namespace detail

/// Writes `recorders` as one trace file at `path` (process `pid`, a thread track per
/// recorder, named by its label): {"traceEvents": [...], "displayTimeUnit": "ms"}. Raises
/// errc::io_error when the file cannot be written.
inline void write_trace(const std::filesystem::path& path,
                        std::span<const trace_recorder* const> recorders, int pid = 0) {
  std::ofstream out(path, std::ios::trunc);
  if (!out)
    fail(errc::io_error, cat("trace: cannot write ", path.string(),
                             "; does the directory exist and is it writable?"));
  out << "{\"traceEvents\":[\n";
  bool first = true;
  const auto separator = [&] {
    if (!first) out << ",\n";
    first = false;
  };
  char number[64];
  const auto fixed = [&](double v) {
    std::snprintf(number, sizeof number, "%.3f", v);
    return std::string(number);
  };
  separator();
  out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << pid
      << ",\"tid\":0,\"args\":{\"name\":\"strata\"}}";
  for (const trace_recorder* r : recorders) {
    if (r == nullptr) continue;
    separator();
    out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << pid << ",\"tid\":" << r->track()
        << ",\"args\":{\"name\":" << detail::json_string(r->label()) << "}}";
    for (const auto& e : r->events()) {
      separator();
      out << "{\"name\":" << detail::json_string(e.name) << ",\"ph\":\"" << (e.counter ? "C" : "X")
          << "\",\"ts\":" << fixed(e.start_us) << ",\"pid\":" << pid << ",\"tid\":" << r->track();
      if (e.counter)
        out << ",\"args\":{\"value\":" << fixed(e.value) << "}}";
      else
        out << ",\"dur\":" << fixed(e.duration_us) << "}";
    }
    if (r->dropped() > 0) {
      separator();
      out << "{\"name\":\"events dropped (trace buffer full)\",\"ph\":\"i\",\"s\":\"t\",\"ts\":"
          << fixed(r->events().empty() ? 0.0 : r->events().back().start_us) << ",\"pid\":" << pid
          << ",\"tid\":" << r->track() << ",\"args\":{\"dropped\":" << r->dropped() << "}}";
    }
  }
  out << "\n],\"displayTimeUnit\":\"ms\"}\n";
  out.flush();
  if (!out) fail(errc::io_error, cat("trace: writing ", path.string(), " failed (disk full?)"));
}

}  // namespace strata

/// @file bench_common.hpp
/// Shared pieces of strata's benchmarks: flags (--json PATH, --quick), best-of-N timing, the
/// same-run memcpy baseline, and the JSON result file
/// `[{"name", "value", "unit", "baseline", "ratio"}]`.
#pragma once

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/buffer.hpp"
#include "strata/core/cli.hpp"
#include "strata/core/error.hpp"
#include "strata/core/timer.hpp"

namespace strata::bench {

/// One reported number: `value` in `unit`, the same-run `baseline` in the same unit, and
/// `ratio` = value / baseline (> 1 means faster than the baseline for throughputs).
struct result {
  std::string name;
  double value = 0;
  std::string unit;
  double baseline = 0;
  double ratio = 0;
};

/// Command-line flags every bench understands.
struct options {
  std::string json_path;  ///< --json PATH: write results there
  bool quick = false;     ///< --quick: smallest sizes only (CI smoke run)
  std::vector<std::string> rest;
  std::string program = "bench", usage;  ///< for refusals of a flag's value

  /// Reads --json PATH and --quick, plus this bench's own `switches` (flags without a value)
  /// and `valued` flags (followed by a value), which land in `rest`. `--help` prints the usage
  /// and exits 0; an unknown flag or a missing value prints what is wrong and the usage to
  /// stderr and exits 2 — a mistyped flag never runs a (long) benchmark with defaults.
  static options parse(int argc, char** argv, std::initializer_list<std::string_view> switches = {},
                       std::initializer_list<std::string_view> valued = {}) {
    const std::string_view program = argc > 0 ? argv[0] : "bench";
    std::string usage = std::string("usage: ") + std::string(program) + " [--quick] [--json PATH]";
    for (const auto flag : switches)
      usage += std::string(" [") + std::string(flag) + "]";
    for (const auto flag : valued)
      usage += std::string(" [") + std::string(flag) + " VALUE]";
    const auto refuse = [&](const std::string& why) {
      std::fprintf(stderr, "%s: %s\n%s\n", std::string(program).c_str(), why.c_str(),
                   usage.c_str());
      std::exit(2);
    };
    const auto listed = [](std::initializer_list<std::string_view> flags, std::string_view arg) {
      return std::find(flags.begin(), flags.end(), arg) != flags.end();
    };
    options o;
    o.program = std::string(program);
    o.usage = usage;
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      if (arg == "--help" || arg == "-h") {
        std::printf("%s\n", usage.c_str());
        std::exit(0);
      } else if (arg == "--json" || listed(valued, arg)) {
        if (i + 1 >= argc) refuse(std::string(arg) + " needs a value");
        if (arg == "--json") {
          o.json_path = argv[++i];
        } else {
          o.rest.emplace_back(arg);
          o.rest.emplace_back(argv[++i]);
        }
      } else if (arg == "--quick") {
        o.quick = true;
      } else if (listed(switches, arg)) {
        o.rest.emplace_back(arg);
      } else {
        refuse("unknown flag '" + std::string(arg) + "'");
      }
    }
    return o;
  }
  /// Value of `--name V` among the remaining flags, or `fallback`.
  [[nodiscard]] std::string get(std::string_view name, std::string fallback) const {
    for (std::size_t i = 0; i + 1 < rest.size(); ++i)
      if (rest[i] == name) return rest[i + 1];
    return fallback;
  }
  /// Value of `--name N` as a whole number in [lo, hi] (strata::cli's strict parsing: no
  /// narrowing, no wrap, `1e6` accepted when whole), or `fallback`; anything else prints the
  /// refusal (flag, value, accepted range) and the usage to stderr and exits 2.
  template <std::integral T>
  [[nodiscard]] T number(std::string_view name, T fallback, T lo, T hi) const {
    const std::string text = get(name, "");
    if (text.empty()) return fallback;
    try {
      return cli::parse_integer<T>(name, text, lo, hi);
    } catch (const strata::error& e) {
      std::fprintf(stderr, "%s: %s\n%s\n", program.c_str(), e.what(), usage.c_str());
      std::exit(2);
    }
  }
};

/// Best (minimum) wall time in seconds of `repeats` runs of `fn`, after one warm-up run.
inline double best_seconds(const std::function<void()>& fn, int repeats = 5) {
  fn();
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) {
    stopwatch watch;
    fn();
    best = std::min(best, watch.seconds());
  }
  return best;
}

/// Same-run baseline: memcpy bandwidth (bytes/s) of `bytes` between two fresh buffers.
inline double memcpy_bytes_per_second(std::size_t bytes, int repeats = 5) {
  aligned_buffer<std::byte> from(bytes), to(bytes);
  std::memset(from.data(), 1, bytes);
  const double seconds = best_seconds([&] { std::memcpy(to.data(), from.data(), bytes); }, repeats);
  return static_cast<double>(bytes) / seconds;
}

/// Prints results as a table and writes them as JSON when --json was given.
/// The whole text of a file (empty when it cannot be read).
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Number after `"key":` in a flat JSON object such as ctr_train's --report-json (NaN when
/// absent).
inline double json_number(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\"");
  if (at == std::string::npos) return std::nan("");
  const auto colon = json.find(':', at);
  return colon == std::string::npos ? std::nan("") : std::strtod(json.c_str() + colon + 1, nullptr);
}

inline void report(const options& o, const std::vector<result>& results) {
  std::printf("%-48s %14s %-8s %14s %8s\n", "name", "value", "unit", "baseline", "ratio");
  for (const auto& r : results)
    std::printf("%-48s %14.4g %-8s %14.4g %8.3f\n", r.name.c_str(), r.value, r.unit.c_str(),
                r.baseline, r.ratio);
  if (o.json_path.empty()) return;
  std::ofstream out(o.json_path);
  if (!out) fail(errc::io_error, cat("cannot write ", o.json_path));
  out << "[\n";
  for (std::size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    out << "  {\"name\": \"" << r.name << "\", \"value\": " << r.value << ", \"unit\": \"" << r.unit
        << "\", \"baseline\": " << r.baseline << ", \"ratio\": " << r.ratio << "}"
        << (i + 1 < results.size() ? ",\n" : "\n");
  }
  out << "]\n";
}

}  // namespace strata::bench

/// @file allreduce_demo.cpp
/// N ranks (threads) allreduce a random gradient with each codec and print, per codec, the
/// bytes each rank put on the wire, the ratio to plain fp32, the max error vs the exact sum
/// and the time.
///
///   allreduce_demo [--ranks N (4)] [--floats F (1048576)]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "strata/comm.hpp"
#include "strata/compress.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/timer.hpp"

using namespace strata;

namespace {

struct row {
  std::string codec;
  double bytes_per_rank = 0;
  double max_error = 0;
  double seconds = 0;
};

float gradient(int rank, std::size_t i) {
  return counter_rng{2024, static_cast<std::uint64_t>(rank)}.normal(i);
}

/// Allreduces the gradient with a codec made by `make(length)`; returns the table row.
template <class Make>
row run(const char* label, int ranks, std::size_t floats, const std::vector<double>& exact,
        Make make) {
  comm::thread_world world(ranks, {.timeout_seconds = 120});
  std::vector<std::uint64_t> sent(static_cast<std::size_t>(ranks));
  std::vector<double> worst(static_cast<std::size_t>(ranks)), seconds(sent.size());
  world.run([&](comm::thread_transport& t) {
    std::vector<float> data(floats);
    for (std::size_t i = 0; i < floats; ++i)
      data[i] = gradient(t.rank(), i);
    auto codec = make(floats);
    comm::barrier(t);
    const auto before = comm::total_bytes_sent(t);
    stopwatch watch;
    if constexpr (std::is_same_v<decltype(codec), std::nullptr_t>)
      comm::allreduce(t, std::span(data));
    else
      compress::compressed_allreduce(t, std::span(data), codec);
    const auto r = static_cast<std::size_t>(t.rank());
    seconds[r] = watch.seconds();
    sent[r] = comm::total_bytes_sent(t) - before;
    for (std::size_t i = 0; i < floats; ++i)
      worst[r] = std::max(worst[r], std::fabs(static_cast<double>(data[i]) - exact[i]));
  });
  row out{label};
  for (std::size_t r = 0; r < sent.size(); ++r) {
    out.bytes_per_rank += static_cast<double>(sent[r]) / static_cast<double>(ranks);
    out.max_error = std::max(out.max_error, worst[r]);
    out.seconds = std::max(out.seconds, seconds[r]);
  }
  return out;
}

long long flag(int argc, char** argv, std::string_view name, long long fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (argv[i] == name) {
      char* end = nullptr;
      const long long value = std::strtoll(argv[i + 1], &end, 10);
      STRATA_EXPECTS(end != argv[i + 1] && *end == '\0', "allreduce_demo: ", name,
                     " needs an integer, got '", argv[i + 1], "'");
      return value;
    }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const long long ranks = flag(argc, argv, "--ranks", 4);
    const long long floats = flag(argc, argv, "--floats", 1 << 20);
    STRATA_EXPECTS(ranks >= 1 && ranks <= 256, "allreduce_demo: --ranks must be in [1, 256], got ",
                   ranks);
    STRATA_EXPECTS(floats >= 0 && floats <= (1LL << 28),
                   "allreduce_demo: --floats must be in [0, 2^28], got ", floats);
    const int n = static_cast<int>(ranks);
    const auto count = static_cast<std::size_t>(floats);
    std::vector<double> exact(count, 0.0);
    for (std::size_t i = 0; i < count; ++i)
      for (int r = 0; r < n; ++r)
        exact[i] += gradient(r, i);

    using namespace strata::compress;
    std::vector<row> rows;
    rows.push_back(
        run("fp32 ring (no codec)", n, count, exact, [](std::size_t) { return nullptr; }));
    rows.push_back(run("identity", n, count, exact, [](std::size_t) { return identity{}; }));
    rows.push_back(run("fp16", n, count, exact, [](std::size_t) { return fp16{}; }));
    rows.push_back(
        run("int8_block<256>", n, count, exact, [](std::size_t) { return int8_block<256>{}; }));
    rows.push_back(run("topk 1% + error feedback", n, count, exact,
                       [](std::size_t m) { return error_feedback<topk>(m, topk(0.01)); }));

    std::printf("allreduce of %zu floats over %d ranks (thread_world)\n", count, n);
    std::printf("%-26s %16s %10s %14s %10s\n", "codec", "wire bytes/rank", "vs fp32", "max |error|",
                "time ms");
    const double fp32 = rows.front().bytes_per_rank;
    for (const auto& r : rows)
      std::printf("%-26s %16.0f %9.2fx %14.3g %10.2f\n", r.codec.c_str(), r.bytes_per_rank,
                  r.bytes_per_rank > 0 ? fp32 / r.bytes_per_rank : 1.0, r.max_error,
                  r.seconds * 1e3);
    std::printf("(topk keeps 1%% per message; the rest stays in the residual for the next step)\n");
  } catch (const strata::error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}

/// @file bench_allreduce.cpp
/// Ring allreduce of floats over thread_world: algbw = bytes / time and
/// busbw = algbw · 2(n−1)/n (nccl-tests definitions), each against the memcpy bandwidth of the
/// same byte count timed in the same run. Time = the slowest rank's time for one allreduce,
/// best of a few repetitions, each started after a barrier. The sum is verified first.
///
/// Flags: --ranks 2,4,8  --max-mib 256  --chunk-kib K (ring chunk size)  --quick (n = 2,4;
/// 1 and 16 MiB)  --json PATH  --checksums (also time each case with thread_world's
/// per-message checksums on: "checksummed algbw" against the plain algbw of the same run)
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "strata/comm.hpp"

using namespace strata;
using namespace strata::comm;

namespace {

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> ranks;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ','))
    ranks.push_back(cli::parse_integer<int>("--ranks", item, 1, 64));
  STRATA_EXPECTS(!ranks.empty(), "--ranks needs a comma-separated list such as 2,4,8");
  return ranks;
}

float initial_value(int rank, std::size_t i) {
  return static_cast<float>(rank + 1) + static_cast<float>(i % 7);
}

/// Runs a verified allreduce, then `repeats` timed ones; returns the best slowest-rank time.
double time_allreduce(int n, std::size_t count, int repeats, ring_allreduce algorithm,
                      bool checksums) {
  thread_world world(n, {.timeout_seconds = 300, .checksums = checksums});
  std::vector<double> seconds(static_cast<std::size_t>(repeats * n));
  world.run([&](thread_transport& t) {
    aligned_buffer<float> data(count);
    for (std::size_t i = 0; i < count; ++i)
      data[i] = initial_value(t.rank(), i);
    allreduce(t, data.span(), reduce_op::sum, algorithm);
    const float base = static_cast<float>(n * (n + 1) / 2);
    for (std::size_t i = 0; i < count; ++i) {
      const float expected = base + static_cast<float>(n) * static_cast<float>(i % 7);
      if (data[i] != expected)
        fail(errc::internal,
             cat("rank ", t.rank(), ": element ", i, " is ", data[i], ", expected ", expected));
    }
    for (int rep = 0; rep < repeats; ++rep) {
      barrier(t);
      stopwatch watch;
      allreduce(t, data.span(), reduce_op::mean, algorithm);  // mean keeps values bounded
      seconds[static_cast<std::size_t>(rep * n + t.rank())] = watch.seconds();
    }
  });
  double best = 1e300;
  for (int rep = 0; rep < repeats; ++rep) {
    const auto first = seconds.begin() + rep * n;
    best = std::min(best, *std::max_element(first, first + n));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const auto o =
      bench::options::parse(argc, argv, {"--checksums"}, {"--ranks", "--max-mib", "--chunk-kib"});
  const bool checksums =
      std::find(o.rest.begin(), o.rest.end(), std::string("--checksums")) != o.rest.end();
  std::vector<int> ranks;
  try {
    ranks = parse_ranks(o.get("--ranks", o.quick ? "2,4" : "2,4,8"));
  } catch (const strata::error& e) {
    std::fprintf(stderr, "%s: %s\n%s\n", o.program.c_str(), e.what(), o.usage.c_str());
    return 2;
  }
  const std::size_t max_mib =
      o.number<std::size_t>("--max-mib", o.quick ? 16 : 256, 1, std::size_t{1} << 16);
  ring_allreduce algorithm;
  algorithm.chunk_bytes =
      o.number<std::size_t>("--chunk-kib", algorithm.chunk_bytes >> 10, 1, std::size_t{1} << 20)
      << 10;
  std::vector<std::size_t> sizes_mib;
  for (std::size_t mib = 1; mib <= max_mib; mib *= o.quick ? 16 : 4)
    sizes_mib.push_back(mib);

  std::vector<bench::result> results;
  for (const std::size_t mib : sizes_mib) {
    const std::size_t bytes = mib << 20;
    const int repeats = mib >= 64 ? 3 : 5;
    const double memcpy_bw = bench::memcpy_bytes_per_second(bytes, repeats) / 1e9;
    for (const int n : ranks) {
      const double seconds = time_allreduce(n, bytes / sizeof(float), repeats, algorithm, false);
      const double algbw = static_cast<double>(bytes) / seconds / 1e9;
      const double busbw = algbw * 2.0 * (n - 1) / n;
      const std::string name = cat("allreduce n=", n, " ", mib, "MiB");
      results.push_back({name + " algbw", algbw, "GB/s", memcpy_bw, algbw / memcpy_bw});
      results.push_back({name + " busbw", busbw, "GB/s", memcpy_bw, busbw / memcpy_bw});
      std::fprintf(stderr, "%s: %.3f ms\n", name.c_str(), seconds * 1e3);
      if (checksums) {
        const double checked = time_allreduce(n, bytes / sizeof(float), repeats, algorithm, true);
        const double checked_bw = static_cast<double>(bytes) / checked / 1e9;
        results.push_back(
            {name + " checksummed algbw", checked_bw, "GB/s", algbw, checked_bw / algbw});
        std::fprintf(stderr, "%s with checksums: %.3f ms (%.1f%% slower)\n", name.c_str(),
                     checked * 1e3, (checked / seconds - 1) * 100);
      }
    }
  }
  bench::report(o, results);
}

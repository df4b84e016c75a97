// strata's ring allreduce over MPI point-to-point (mpi::transport) vs the MPI library's own
// MPI_Allreduce, timed in the same run; plus mpi::native_allreduce (MPI_Iallreduce polled with
// the transport's timeout only with .poll). Run under mpiexec with 2 or 4 processes:
//
//   mpiexec -n 4 build/bench/bench_allreduce_mpi [--quick] [--json out.json]
//
// Sizes 1, 4, 16, 64 MiB of float32 (--quick: 1 and 4 MiB). Each algorithm is verified against
// a float64 sum first, then timed: best of R runs of max-over-ranks time. algbw = bytes / time,
// busbw = algbw · 2(N−1)/N (nccl-tests' definitions); ratio = ring algbw / MPI_Allreduce algbw.
// Built with strata::mpi linked by cmake/strata_mpi.cmake (bench/CMakeLists.txt globs it).
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "strata/comm/collectives.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/timer.hpp"
#include "strata/mpi/environment.hpp"
#include "strata/mpi/native_allreduce.hpp"
#include "strata/mpi/transport.hpp"

using namespace strata;

namespace {

float value_for(int rank, std::size_t i) {
  return counter_rng{3, static_cast<std::uint64_t>(rank)}.uniform(i, -1.0f, 1.0f);
}

/// Fills `data` with this rank's values, runs `algorithm` once, and checks every element
/// against the float64 sum over ranks (raises `errc::internal` on any rank that differs).
template <class Algorithm>
void verify(mpi::transport& t, std::vector<float>& data, const char* name, Algorithm algorithm) {
  for (std::size_t i = 0; i < data.size(); ++i)
    data[i] = value_for(t.rank(), i);
  algorithm(std::span(data));
  for (std::size_t i = 0; i < data.size(); i += 7) {  // every 7th element: quick enough
    double exact = 0;
    for (int r = 0; r < t.size(); ++r)
      exact += value_for(r, i);
    if (std::abs(data[i] - exact) > 1e-5 * (1 + std::abs(exact)))
      fail(errc::internal,
           cat(name, ": rank ", t.rank(), " element ", i, " is ", data[i], ", expected ", exact));
  }
}

/// Best over `repeats` rounds of the slowest rank's time of one call, for every algorithm;
/// the rounds interleave the algorithms so drift on a shared machine hits them alike.
std::vector<double> best_max_seconds(
    mpi::transport& t, std::vector<float>& data, int repeats,
    const std::vector<std::function<void(std::span<float>)>>& algorithms) {
  std::vector<double> best(algorithms.size(), 1e300);
  for (const auto& algorithm : algorithms)  // warm-up
    algorithm(std::span(data));
  for (int r = 0; r < repeats; ++r)
    for (std::size_t a = 0; a < algorithms.size(); ++a) {
      comm::barrier(t);
      stopwatch watch;
      algorithms[a](std::span(data));
      double seconds = watch.seconds();
      MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, t.communicator());
      best[a] = std::min(best[a], seconds);
    }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  mpi::environment env(argc, argv);
  try {
    const auto options = bench::options::parse(argc, argv);
    mpi::transport t({.timeout_seconds = 120});
    const int n = t.size();
    const auto ring = [&](std::span<float> d) { comm::ring_allreduce{}(t, d); };
    const auto native = [&](std::span<float> d) { mpi::native_allreduce{}(t, d); };
    const auto polled = [&](std::span<float> d) { mpi::native_allreduce{.poll = true}(t, d); };
    const auto library = [&](std::span<float> d) {
      MPI_Allreduce(MPI_IN_PLACE, d.data(), static_cast<int>(d.size()), MPI_FLOAT, MPI_SUM,
                    t.communicator());
    };
    const std::vector<std::size_t> mib =
        options.quick ? std::vector<std::size_t>{1, 4} : std::vector<std::size_t>{1, 4, 16, 64};
    std::vector<bench::result> results;
    for (const std::size_t m : mib) {
      const std::size_t bytes = m << 20;
      std::vector<float> data(bytes / sizeof(float));
      verify(t, data, "ring_allreduce", ring);
      verify(t, data, "native_allreduce", native);
      verify(t, data, "native_allreduce{.poll}", polled);
      verify(t, data, "MPI_Allreduce", library);
      const int repeats = options.quick ? 3 : (m >= 64 ? 4 : 7);
      const auto seconds = best_max_seconds(t, data, repeats, {ring, native, polled, library});
      const double ring_s = seconds[0], native_s = seconds[1], polled_s = seconds[2],
                   library_s = seconds[3];
      const double gb = static_cast<double>(bytes) / 1e9;
      const double bus = 2.0 * (n - 1) / n;
      const std::string at = cat("_np", n, "_", m, "MiB");
      results.push_back({"ring_allreduce_mpi_algbw" + at, gb / ring_s, "GB/s", gb / library_s,
                         library_s / ring_s});
      results.push_back({"ring_allreduce_mpi_busbw" + at, bus * gb / ring_s, "GB/s",
                         bus * gb / library_s, library_s / ring_s});
      results.push_back({"native_allreduce_algbw" + at, gb / native_s, "GB/s", gb / library_s,
                         library_s / native_s});
      results.push_back({"native_allreduce_poll_algbw" + at, gb / polled_s, "GB/s", gb / library_s,
                         library_s / polled_s});
    }
    if (t.rank() == 0) {
      std::printf("allreduce over MPI, %d processes (%s); baseline = MPI_Allreduce\n", n,
                  mpi::environment::library_version().substr(0, 40).c_str());
      bench::report(options, results);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce_mpi: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return 0;
}

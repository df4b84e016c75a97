#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "strata/comm.hpp"
#include "strata/compress.hpp"
#include "strata/core/rng.hpp"

using namespace strata;
using namespace strata::comm;
using namespace strata::compress;

namespace {
float value_for(int rank, std::size_t i, bool sparse) {
  if (sparse && i % 8 != 3) return 0.0f;
  return counter_rng{9, static_cast<std::uint64_t>(rank)}.normal(i);
}

/// Per-element bound on |result − exact| for a codec, from Σ_r |x_r| (the largest any
/// partial sum can be) and the world size: the ring encodes each value N times.
using bound_fn = std::function<double(double abs_sum, double block_abs_sum_max, int n)>;

/// Runs compressed_allreduce on `n` ranks and checks every rank against the float64 sum,
/// and that all ranks end bit-identical.
template <class MakeCodec>
void check(int n, std::size_t count, MakeCodec make, const bound_fn& bound, reduce_op op,
           std::size_t chunk, bool sparse = false) {
  thread_world world(n, {.timeout_seconds = 20});
  std::vector<std::vector<float>> results(static_cast<std::size_t>(n));
  world.run([&](thread_transport& t) {
    std::vector<float> data(count);
    for (std::size_t i = 0; i < count; ++i)
      data[i] = value_for(t.rank(), i, sparse);
    auto codec = make(count);
    compressed_allreduce(t, std::span(data), codec, op, chunk);
    results[static_cast<std::size_t>(t.rank())] = std::move(data);
  });
  double global_abs_max = 0;
  std::vector<double> exact(count), abs_sum(count);
  for (std::size_t i = 0; i < count; ++i) {
    for (int r = 0; r < n; ++r) {
      exact[i] += value_for(r, i, sparse);
      abs_sum[i] += std::fabs(value_for(r, i, sparse));
    }
    global_abs_max = std::max(global_abs_max, abs_sum[i]);
  }
  const double divisor = op == reduce_op::mean ? n : 1;
  for (std::size_t i = 0; i < count; ++i) {
    const double tolerance = n == 1 ? 0.0 : bound(abs_sum[i], global_abs_max, n) / divisor;
    // FAIL on a miss only: a passing REQUIRE per element (with its INFO) was most of this
    // test's time under the sanitizers.
    if (!(std::fabs(results[0][i] - exact[i] / divisor) <= tolerance))
      FAIL("ranks=" << n << " count=" << count << " chunk=" << chunk << " i=" << i << ": got "
                    << results[0][i] << ", exact " << exact[i] / divisor << ", tolerance "
                    << tolerance);
  }
  for (int r = 1; r < n && count > 0; ++r)
    REQUIRE(std::memcmp(results[0].data(), results[static_cast<std::size_t>(r)].data(),
                        count * sizeof(float)) == 0);
}

// Tolerances derived from each codec's bound (plus float32 summation, ~N·2^-24 relative).
double float_sum(double abs_sum, int n) {
  return (n + 1) * 0x1p-23 * abs_sum + 1e-30;
}
const bound_fn exact_bound = [](double s, double, int n) { return float_sum(s, n); };
const bound_fn fp16_bound = [](double s, double, int n) {  // N encodes, each ≤ 2^-11 relative
  return n * 0x1p-11 * s * 1.01 + n * 0x1p-25 + float_sum(s, n);
};
const bound_fn int8_bound = [](double s, double global, int n) {  // N encodes, ≤ absmax/254
  return n * global / 254.0 * 1.01 + float_sum(s, n);
};
}  // namespace

TEST_CASE("compressed allreduce matches the float64 sum within codec bounds", "[compress][ring]") {
  for (int n : {1, 2, 3, 4}) {
    for (std::size_t count : {0u, 1u, 2u, 3u, 5u, 257u, 1000u, 4099u}) {
      for (std::size_t chunk : {std::size_t{64}, default_chunk_floats}) {
        for (reduce_op op : {reduce_op::sum, reduce_op::mean}) {
          check(
              n, count, [](std::size_t) { return identity{}; }, exact_bound, op, chunk);
          check(
              n, count, [](std::size_t) { return fp16{}; }, fp16_bound, op, chunk);
          check(
              n, count, [](std::size_t) { return int8_block<256>{}; }, int8_bound, op, chunk);
          check(
              n, count, [](std::size_t) { return int8_block<7>{}; }, int8_bound, op, chunk);
          check(
              n, count, [](std::size_t m) { return error_feedback<int8_block<256>>(m); },
              int8_bound, op, chunk);
          check(
              n, count, [](std::size_t) { return topk(1.0); }, exact_bound, op, chunk);
          // At most 1 in 8 entries is non-zero, so a 25% topk keeps all of them: exact.
          check(
              n, count, [](std::size_t) { return topk(0.25); }, exact_bound, op, chunk, true);
          check(
              n, count, [](std::size_t m) { return error_feedback<topk>(m, topk(0.25)); },
              exact_bound, op, chunk, true);
        }
      }
    }
  }
}

TEST_CASE("int8_block<256> sends >= 3.9x fewer bytes than fp32", "[compress][ring]") {
  const std::size_t count = 1 << 16;
  for (int n : {2, 4}) {
    thread_world world(n, {.timeout_seconds = 20});
    std::vector<std::uint64_t> plain(static_cast<std::size_t>(n)),
        packed(static_cast<std::size_t>(n));
    world.run([&](thread_transport& t) {
      std::vector<float> data(count, 1.0f);
      auto before = total_bytes_sent(t);
      allreduce(t, std::span(data));
      plain[static_cast<std::size_t>(t.rank())] = total_bytes_sent(t) - before;
      before = total_bytes_sent(t);
      int8_block<256> codec;
      compressed_allreduce(t, std::span(data), codec);
      packed[static_cast<std::size_t>(t.rank())] = total_bytes_sent(t) - before;
    });
    for (int r = 0; r < n; ++r) {
      const double ratio = static_cast<double>(plain[static_cast<std::size_t>(r)]) /
                           static_cast<double>(packed[static_cast<std::size_t>(r)]);
      INFO("ranks=" << n << " rank=" << r << " plain=" << plain[static_cast<std::size_t>(r)]
                    << " int8=" << packed[static_cast<std::size_t>(r)]);
      CHECK(ratio >= 3.9);
    }
  }
}

TEST_CASE("error feedback through the ring: no drift over many steps", "[compress][ring]") {
  // Σ_t result_t = Σ_t exact_t − Σ_ranks residual_T (each rank encodes each position once per
  // call), so the running gap is bounded by the residuals; without EF topk drifts away.
  const int n = 3, steps = 60;
  const std::size_t count = 600;
  const auto gradient = [](int rank, int step, std::size_t i) {
    return 0.05f * (counter_rng{5, 0}.uniform(i) - 0.5f) +
           counter_rng{6, static_cast<std::uint64_t>(step * 16 + rank)}.normal(i);
  };
  const auto run = [&](bool feedback) {
    thread_world world(n, {.timeout_seconds = 20});
    std::vector<double> gap_after(steps, 0.0);
    std::vector<std::vector<float>> residuals(n);
    std::vector<double> running_result(count, 0.0);
    std::mutex mutex;
    world.run([&](thread_transport& t) {
      error_feedback<topk> ef(count, topk(0.1));
      topk plain(0.1);
      std::vector<double> running_exact(count, 0.0), running(count, 0.0);
      for (int step = 0; step < steps; ++step) {
        std::vector<float> data(count);
        for (std::size_t i = 0; i < count; ++i) {
          data[i] = gradient(t.rank(), step, i);
          for (int r = 0; r < n; ++r)
            running_exact[i] += gradient(r, step, i);
        }
        if (feedback)
          compressed_allreduce(t, std::span(data), ef, reduce_op::sum, 128);
        else
          compressed_allreduce(t, std::span(data), plain, reduce_op::sum, 128);
        double gap = 0;
        for (std::size_t i = 0; i < count; ++i) {
          running[i] += data[i];
          gap = std::max(gap, std::fabs(running_exact[i] - running[i]));
        }
        if (t.rank() == 0) gap_after[static_cast<std::size_t>(step)] = gap;
      }
      std::lock_guard lock(mutex);
      residuals[static_cast<std::size_t>(t.rank())].assign(ef.residual().begin(),
                                                           ef.residual().end());
      if (t.rank() == 0) {
        for (std::size_t i = 0; i < count; ++i)
          running_result[i] = running_exact[i] - running[i];  // the gap per position
      }
    });
    if (feedback) {
      for (std::size_t i = 0; i < count; ++i) {
        double residual_sum = 0;
        for (const auto& r : residuals)
          residual_sum += r[i];
        REQUIRE(running_result[i] == Approx(residual_sum).margin(1e-3));
      }
    }
    return gap_after;
  };
  const auto with_ef = run(true);
  const auto without = run(false);
  const double ef_first = *std::max_element(with_ef.begin(), with_ef.begin() + 30);
  const double ef_second = *std::max_element(with_ef.begin() + 30, with_ef.end());
  CHECK(ef_second < 1.5 * ef_first);
  CHECK(without.back() > 1.4 * without[14]);
  CHECK(without.back() > 2.0 * with_ef.back());
}

TEST_CASE("compressed allreduce rejects mismatched inputs", "[compress][ring]") {
  SECTION("lengths") {
    thread_world world(3, {.timeout_seconds = 5});
    REQUIRE_THROWS_WITH(world.run([](thread_transport& t) {
      std::vector<float> data(t.rank() == 1 ? 10 : 12, 1.0f);
      fp16 codec;
      compressed_allreduce(t, std::span(data), codec);
    }),
                        Catch::Contains("every rank must pass the same length"));
  }
  SECTION("topk fractions") {
    thread_world world(2, {.timeout_seconds = 5});
    REQUIRE_THROWS_WITH(world.run([](thread_transport& t) {
      std::vector<float> data(1000, 1.0f);
      topk codec(t.rank() == 0 ? 0.5 : 0.01);
      compressed_allreduce(t, std::span(data), codec);
    }),
                        Catch::Contains("same codec settings"));
  }
  SECTION("codecs") {
    thread_world world(2, {.timeout_seconds = 5});
    REQUIRE_THROWS_AS(world.run([](thread_transport& t) {
      std::vector<float> data(1000, 1.0f);
      if (t.rank() == 0) {
        fp16 codec;
        compressed_allreduce(t, std::span(data), codec);
      } else {
        int8_block<256> codec;
        compressed_allreduce(t, std::span(data), codec);
      }
    }),
                      error);
  }
  SECTION("error feedback length") {
    thread_world world(1);
    REQUIRE_THROWS_WITH(world.run([](thread_transport& t) {
      std::vector<float> data(100, 1.0f);
      error_feedback<fp16> codec(99);
      compressed_allreduce(t, std::span(data), codec);
    }),
                        Catch::Contains("construct it with the buffer's length"));
  }
}

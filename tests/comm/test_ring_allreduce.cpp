#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <vector>

#include "strata/comm.hpp"

using namespace strata;
using namespace strata::comm;

namespace {
template <class V>
V value_for(int rank, std::size_t i) {
  return static_cast<V>((rank + 1) * 3 + static_cast<int>(i % 17));
}
template <class V>
void check_allreduce(int n, std::size_t count, reduce_op op, std::size_t chunk_bytes) {
  thread_world world(n, {.timeout_seconds = 20});
  world.run([&](thread_transport& t) {
    std::vector<V> data(count);
    for (std::size_t i = 0; i < count; ++i)
      data[i] = value_for<V>(t.rank(), i);
    allreduce(t, std::span(data), op, ring_allreduce{chunk_bytes});
    for (std::size_t i = 0; i < count; ++i) {
      V expected{};
      for (int r = 0; r < n; ++r)
        expected += value_for<V>(r, i);
      if (op == reduce_op::mean) expected /= static_cast<V>(n);
      if constexpr (std::is_floating_point_v<V>)
        REQUIRE(data[i] == Approx(expected).epsilon(1e-6));
      else
        REQUIRE(data[i] == expected);
    }
  });
}
}  // namespace

TEMPLATE_TEST_CASE("ring allreduce sums and averages any length", "[comm][ring]", float, double,
                   std::int32_t, std::int64_t) {
  for (int n : {1, 2, 3, 4, 7}) {
    for (std::size_t count : {0u, 1u, 2u, 5u, 64u, 1000u, 4099u}) {
      INFO("n=" << n << " count=" << count);
      check_allreduce<TestType>(n, count, reduce_op::sum, 64);
      check_allreduce<TestType>(n, count, reduce_op::mean, 1 << 20);
    }
  }
}

TEST_CASE("each rank sends 2(N-1)/N of the gradient bytes", "[comm][ring]") {
  const std::size_t count = 1 << 16;  // divisible by every N below
  for (int n : {2, 4, 8}) {
    thread_world world(n);
    std::vector<std::uint64_t> sent(static_cast<std::size_t>(n));
    world.run([&](thread_transport& t) {
      std::vector<float> data(count, 1.0f);
      const auto before = total_bytes_sent(t);
      allreduce(t, std::span(data));
      sent[static_cast<std::size_t>(t.rank())] = total_bytes_sent(t) - before;
      REQUIRE(data[0] == static_cast<float>(n));
    });
    const double payload = count * sizeof(float);
    for (auto bytes : sent) {
      // 8 bytes per rank for the length check travel too.
      CHECK(static_cast<double>(bytes) == Approx(2.0 * (n - 1) / n * payload + 8).epsilon(1e-9));
    }
  }
}

TEST_CASE("mismatched lengths are reported, not a hang", "[comm][ring]") {
  thread_world world(3, {.timeout_seconds = 5});
  REQUIRE_THROWS_WITH(world.run([](thread_transport& t) {
    std::vector<float> data(t.rank() == 1 ? 10 : 12, 1.0f);
    allreduce(t, std::span(data));
  }),
                      Catch::Contains("every rank must pass the same length"));
}

TEST_CASE("allgather, broadcast and barrier", "[comm]") {
  for (int n : {1, 2, 3, 5, 8}) {
    thread_world world(n);
    world.run([&](thread_transport& t) {
      std::vector<int> mine{t.rank(), t.rank() * 10};
      std::vector<int> all(2 * static_cast<std::size_t>(n));
      allgather(t, std::span<const int>(mine), std::span(all));
      for (int r = 0; r < n; ++r) {
        REQUIRE(all[2 * r] == r);
        REQUIRE(all[2 * r + 1] == r * 10);
      }
      for (int root = 0; root < n; ++root) {
        std::vector<double> data(3, t.rank() == root ? 1.5 * root : -1.0);
        broadcast(t, std::span(data), root);
        REQUIRE(data == std::vector<double>(3, 1.5 * root));
      }
      barrier(t);
    });
  }
}

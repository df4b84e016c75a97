#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "strata/comm.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/timer.hpp"

using namespace strata;
using namespace strata::comm;

namespace {

/// Catch2 v2 assertions are not thread-safe, so rank threads check with `ensure`: it throws,
/// the world stops, and run() rethrows the message on the test's thread.
template <class... Parts>
void ensure(bool ok, const Parts&... parts) {
  if (!ok) strata::fail(strata::errc::internal, strata::cat("check failed: ", parts...));
}
template <class V>
V value_for(int rank, std::size_t i) {
  return static_cast<V>((rank + 1) * 3 + static_cast<int>(i % 17));
}
template <class V>
void check_allreduce(int n, std::size_t count, reduce_op op, std::size_t chunk_bytes) {
  thread_world world(n, {.timeout_seconds = 20});
  run_all(world, [&](thread_transport& t) {
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
        ensure(std::abs(data[i] - expected) <= 1e-6 * std::max<V>(1, std::abs(expected)), "n=", n,
               " count=", count, " i=", i, ": ", data[i], " != ", expected);
      else
        ensure(data[i] == expected, "n=", n, " count=", count, " i=", i, ": ", data[i],
               " != ", expected);
    }
  });
}

/// Runs `fn` on every rank and asserts (on the test's thread) that every rank finished.
template <class Fn>
void run_all(strata::comm::thread_world& world, Fn&& fn) {
  std::atomic<int> finished{0};
  world.run([&](strata::comm::thread_transport& t) {
    fn(t);
    finished.fetch_add(1);
  });
  REQUIRE(finished.load() == world.size());
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
    run_all(world, [&](thread_transport& t) {
      std::vector<float> data(count, 1.0f);
      const auto before = total_bytes_sent(t);
      allreduce(t, std::span(data));
      sent[static_cast<std::size_t>(t.rank())] = total_bytes_sent(t) - before;
      ensure(data[0] == static_cast<float>(n), "sum ", data[0]);
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
    run_all(world, [&](thread_transport& t) {
      std::vector<int> mine{t.rank(), t.rank() * 10};
      std::vector<int> all(2 * static_cast<std::size_t>(n));
      allgather(t, std::span<const int>(mine), std::span(all));
      for (int r = 0; r < n; ++r) {
        ensure(all[2 * r] == r && all[2 * r + 1] == r * 10, "allgather block ", r);
      }
      for (int root = 0; root < n; ++root) {
        std::vector<double> data(3, t.rank() == root ? 1.5 * root : -1.0);
        broadcast(t, std::span(data), root);
        ensure(data == std::vector<double>(3, 1.5 * root), "broadcast from ", root);
      }
      barrier(t);
    });
  }
}

TEST_CASE("8 ranks, 50 allreduces of random lengths match a naive sum", "[comm][ring]") {
  constexpr int n = 8, rounds = 50;
  thread_world world(n, {.timeout_seconds = 30});
  run_all(world, [&](thread_transport& t) {
    for (int round = 0; round < rounds; ++round) {
      const counter_rng shape{77, static_cast<std::uint64_t>(round)};  // same on every rank
      const std::size_t count = shape.below(0, 3000);
      const std::size_t chunk_bytes = 8 * (1 + shape.below(1, 300));
      const auto value = [&](int rank, std::size_t i) {
        return static_cast<std::int64_t>(
                   counter_rng{static_cast<std::uint64_t>(round), static_cast<std::uint64_t>(rank)}
                       .below(i, 2001)) -
               1000;
      };
      std::vector<std::int64_t> exact(count);
      std::vector<float> approx(count);
      for (std::size_t i = 0; i < count; ++i) {
        exact[i] = value(t.rank(), i);
        approx[i] = static_cast<float>(exact[i]) * 0.001f;
      }
      allreduce(t, std::span(exact), reduce_op::sum, ring_allreduce{chunk_bytes});
      allreduce(t, std::span(approx), round % 2 ? reduce_op::mean : reduce_op::sum,
                ring_allreduce{chunk_bytes});
      for (std::size_t i = 0; i < count; ++i) {
        std::int64_t naive = 0;
        double naive_float = 0;
        for (int r = 0; r < n; ++r) {
          naive += value(r, i);
          naive_float += static_cast<double>(static_cast<float>(value(r, i)) * 0.001f);
        }
        if (round % 2) naive_float /= n;
        if (exact[i] != naive)
          fail(errc::internal, cat("round ", round, " i ", i, ": ", exact[i], " != ", naive));
        if (std::abs(approx[i] - naive_float) > 1e-5 * (1 + std::abs(naive_float)))
          fail(errc::internal,
               cat("round ", round, " i ", i, ": ", approx[i], " vs ", naive_float));
      }
    }
  });
}

TEST_CASE("allreduce on a transport without sendrecv_consume uses scratch", "[comm][ring]") {
  // A wrapper that hides sendrecv_consume: the portable copy-then-add path.
  struct plain {
    thread_transport* t;
    int rank() const { return t->rank(); }
    int size() const { return t->size(); }
    void send(int p, tag_t g, std::span<const std::byte> b) { t->send(p, g, b); }
    void recv(int p, tag_t g, std::span<std::byte> b) { t->recv(p, g, b); }
    std::vector<std::byte> recv_message(int p, tag_t g) { return t->recv_message(p, g); }
    message recv_any(tag_t g) { return t->recv_any(g); }
    void sendrecv(int to, std::span<const std::byte> o, int from, std::span<std::byte> i, tag_t g) {
      t->sendrecv(to, o, from, i, g);
    }
    std::uint64_t bytes_sent_to(int p) const { return t->bytes_sent_to(p); }
    std::uint64_t bytes_received_from(int p) const { return t->bytes_received_from(p); }
    double timeout_seconds() const { return t->timeout_seconds(); }
  };
  static_assert(transport<plain>);
  static_assert(!consuming_transport<plain>);
  thread_world world(3, {.timeout_seconds = 10});
  run_all(world, [](thread_transport& t) {
    plain p{&t};
    std::vector<double> data(1001);
    for (std::size_t i = 0; i < data.size(); ++i)
      data[i] = static_cast<double>(i) * (t.rank() + 1);
    allreduce(p, std::span(data), reduce_op::mean, ring_allreduce{64});
    for (std::size_t i = 0; i < data.size(); ++i)
      ensure(std::abs(data[i] - 2.0 * static_cast<double>(i)) < 1e-9 * (1 + data[i]), "i=", i);
  });
}

TEST_CASE("broadcast of mismatched sizes errors instead of hanging", "[comm]") {
  thread_world world(4, {.timeout_seconds = 5});
  stopwatch watch;
  REQUIRE_THROWS_WITH(world.run([](thread_transport& t) {
    std::vector<float> data(t.rank() == 3 ? 5 : 8, 1.0f);
    broadcast(t, std::span(data), 0);
  }),
                      Catch::Contains("size_mismatch") && Catch::Contains("rank 3") &&
                          Catch::Contains("32 bytes but 20 were expected"));
  REQUIRE(watch.seconds() < 4);  // an error, not the timeout
}

TEST_CASE("allgather of mismatched lengths errors", "[comm]") {
  thread_world world(3, {.timeout_seconds = 5});
  REQUIRE_THROWS_WITH(world.run([](thread_transport& t) {
    std::vector<int> mine(t.rank() == 2 ? 3 : 2, 1);
    std::vector<int> all(mine.size() * 3);
    allgather(t, std::span<const int>(mine), std::span(all));
  }),
                      Catch::Contains("every rank must pass the same length"));
  REQUIRE_THROWS_WITH(thread_world(2).run([](thread_transport& t) {
    std::vector<int> mine(2), all(3);
    allgather(t, std::span<const int>(mine), std::span(all));
  }),
                      Catch::Contains("allgather: output has 3 elements, needs 2 x 2 ranks"));
}

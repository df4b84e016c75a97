#include <catch2/catch.hpp>

#include "strata/comm/group.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/train/detail/exchange.hpp"
#include "support/ensure.hpp"

using namespace strata;

TEST_CASE("ordered allreduce sums in rank order, bitwise", "[train][exchange]") {
  for (int n : {1, 2, 3, 5}) {
    for (std::size_t count : {0u, 1u, 3u, 1000u}) {
      comm::thread_world world(n, {.timeout_seconds = 20});
      REQUIRE_NOTHROW(world.run([&](comm::thread_transport& t) {
        const auto value = [](int r, std::size_t i) {
          return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r) * (1 + r * 1e3));
        };
        std::vector<float> data(count);
        for (std::size_t i = 0; i < count; ++i)
          data[i] = value(t.rank(), i);
        train::detail::ordered_allreduce(t, std::span(data));
        for (std::size_t i = 0; i < count; ++i) {
          float expected = value(0, i);
          for (int r = 1; r < n; ++r)
            expected += value(r, i);
          // bitwise: same order as a serial loop over ranks
          strata_test::ensure(data[i] == expected, "rank ", t.rank(), " value ", i, ": ", data[i],
                              " != ", expected);
        }
      }));
    }
  }
}

TEST_CASE("ordered allreduce sums float64 values in rank order too (batch-norm statistics)",
          "[train][exchange]") {
  for (int n : {2, 3}) {
    // The inputs are computed once (a compiler may contract a formula differently where it is
    // inlined twice).
    std::vector<std::vector<double>> inputs(static_cast<std::size_t>(n), std::vector<double>(17));
    for (int r = 0; r < n; ++r)
      for (std::size_t i = 0; i < 17; ++i)
        inputs[static_cast<std::size_t>(r)][i] =
            std::sin(0.37 * static_cast<double>(i) + r) * (1 + r * 1e9);
    comm::thread_world world(n, {.timeout_seconds = 20});
    REQUIRE_NOTHROW(world.run([&](comm::thread_transport& t) {
      std::vector<double> data = inputs[static_cast<std::size_t>(t.rank())];
      train::detail::ordered_allreduce(t, std::span(data));
      for (std::size_t i = 0; i < data.size(); ++i) {
        double expected = inputs[0][i];
        for (std::size_t r = 1; r < inputs.size(); ++r)
          expected += inputs[r][i];
        strata_test::ensure(data[i] == expected, "rank ", t.rank(), " value ", i);
      }
    }));
  }
}

TEST_CASE("allgatherv gathers blobs of different lengths in rank order", "[train][exchange]") {
  comm::thread_world world(4);
  REQUIRE_NOTHROW(world.run([](comm::thread_transport& t) {
    std::vector<std::byte> mine(static_cast<std::size_t>(t.rank()) * 3, std::byte(t.rank()));
    const auto all = train::detail::allgatherv(t, mine);
    strata_test::ensure(all.size() == 4, "gathered ", all.size(), " blobs");
    for (int r = 0; r < 4; ++r) {
      strata_test::ensure(all[r].size() == static_cast<std::size_t>(r) * 3, "blob ", r, " has ",
                          all[r].size(), " bytes");
      for (auto b : all[r])
        strata_test::ensure(b == std::byte(r), "blob ", r, " holds a wrong byte");
    }
  }));
}

TEST_CASE("a group runs collectives among a subset of ranks", "[train][comm][group]") {
  comm::thread_world world(5, {.timeout_seconds = 10});
  world.run([](comm::thread_transport& t) {
    if (t.rank() == 1 || t.rank() == 3) return;  // not members (e.g. servers)
    comm::group workers(t, {0, 2, 4});
    std::vector<double> data(7, 1.0 + workers.rank());
    comm::allreduce(workers, std::span(data));
    strata_test::ensure(data == std::vector<double>(7, 6.0), "group sum on rank ", t.rank());
    bool refused = false;
    try {
      (void)workers.base_rank(3);
    } catch (const strata::error&) {
      refused = true;
    }
    strata_test::ensure(refused, "base_rank(3) of a 3-member group did not throw");
  });
  REQUIRE_THROWS_WITH(world.run([](comm::thread_transport& t) { comm::group g(t, {0}); }),
                      Catch::Contains("not a member"));
}

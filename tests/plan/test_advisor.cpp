// strata::plan: the advisor's cost model against hand-computed α–β costs, its ranking and
// reason, and the inputs it refuses. Its accuracy against emulated runs is checked by
// examples_advisor_accuracy (scripts/experiments.py --check-advisor).
#include <catch2/catch.hpp>

#include "strata/core/error.hpp"
#include "strata/plan/advisor.hpp"

using namespace strata;

namespace {

plan::measured_step ring_probe() {
  plan::measured_step m;
  m.strategy = "allreduce";
  m.codec = "none";
  m.workers = 4;
  m.local_seconds = 0.010;
  m.dense_ring_bytes = 1.5 * 2e6;  // 2(N-1)/N x 2 MB of dense parameters
  m.ring_bytes = 3.5e6;            // the ring plus the touched rows' all-gather
  return m;
}

plan::measured_step ps_probe() {
  plan::measured_step m;
  m.strategy = "ps";
  m.codec = "none";
  m.workers = 4;
  m.servers = 2;
  m.local_seconds = 0.012;
  m.push_bytes = 2.1e6;
  m.pull_bytes = 2.0e6;
  m.server_in_bytes = 4.2e6;  // 4 workers' pushes over 2 servers
  m.server_out_bytes = 4.0e6;
  return m;
}

}  // namespace

TEST_CASE("the ring's cost is 2(N-1) rounds per column plus the all-gather, bytes over the link") {
  const plan::network net{1.25e9, 50e-6};
  const auto p = plan::predict(ring_probe(), net);
  // 3 MB of ring payload over 4 workers with 1 MiB chunks: one column; 2 x 3 rounds + 1.
  CHECK(p.latency_rounds == 7);
  const double expected = 0.010 + 7 * 50e-6 + 3.5e6 / 1.25e9;
  CHECK(p.step_seconds == Approx(expected).epsilon(1e-12));
  CHECK(p.worker_bytes == Approx(7e6));
  CHECK(p.busiest_machine_bytes == Approx(7e6));

  // Larger than N chunks: more columns, more rounds.
  auto big = ring_probe();
  big.dense_ring_bytes = 1.5 * 40e6;  // 40 MB over 4 workers in 1 MiB chunks: 10 columns
  CHECK(plan::predict(big, net).latency_rounds == 2 * 3 * 10 + 1);
  // The trainer's rank-ordered sum: one round to the owners, N−1 around the ring.
  auto ordered = big;
  ordered.rank_ordered_sum = true;
  CHECK(plan::predict(ordered, net).latency_rounds == 4 + 1);
  // One worker has no ring.
  auto alone = ring_probe();
  alone.workers = 1;
  alone.ring_bytes = 0;
  CHECK(plan::predict(alone, net).network_seconds == 0);
}

TEST_CASE("a parameter server's phases are paced by its busiest interface") {
  const plan::network net{1.25e8, 500e-6};
  const auto p = plan::predict(ps_probe(), net);
  const double expected = 0.012 + 3 * 500e-6 + (4.0e6 + 4.2e6) / 1.25e8;
  CHECK(p.step_seconds == Approx(expected).epsilon(1e-12));
  CHECK(p.busiest_machine_bytes == Approx(8.2e6));
  // With as many servers as workers the worker's own interface sets the pace.
  auto spread = ps_probe();
  spread.servers = 4;
  spread.server_in_bytes = 2.1e6;
  spread.server_out_bytes = 1.0e6;  // less than a worker receives
  const auto q = plan::predict(spread, net);
  CHECK(q.network_seconds == Approx(3 * 500e-6 + (2.0e6 + 2.1e6) / 1.25e8).epsilon(1e-12));

  // The servers' work overlaps the transfers: a wait shorter than them is hidden by them,
  // a longer one replaces them.
  auto busy = ps_probe();
  busy.server_wait_seconds = 0.004;
  CHECK(plan::predict(busy, net).step_seconds == Approx(expected - 0.004).epsilon(1e-12));
  busy.server_wait_seconds = 0.012;  // the whole step waits on the servers
  const double transfers = 3 * 500e-6 + (4.0e6 + 4.2e6) / 1.25e8;
  CHECK(plan::predict(busy, plan::network{1.25e10, 0}).step_seconds ==
        Approx(0.012).epsilon(1e-12));
  CHECK(plan::predict(busy, net).step_seconds == Approx(transfers).epsilon(1e-12));

  // Hybrid pays both: the dense ring and the rows through the servers.
  auto hybrid = ps_probe();
  hybrid.strategy = "hybrid";
  hybrid.ring_bytes = 3e6;
  hybrid.dense_ring_bytes = 3e6;
  const auto h = plan::predict(hybrid, net);
  CHECK(h.latency_rounds == 2 * 3 + 3);
  CHECK(h.network_seconds == Approx(9 * 500e-6 + (3e6 + 4.0e6 + 4.2e6) / 1.25e8).epsilon(1e-12));
  // ... but the next step's pull runs beside the ring: the step pays the push, then the
  // longer of the two.
  const double ring_part = 6 * 500e-6 + 3e6 / 1.25e8;
  const double pull_part = 2 * 500e-6 + 4.0e6 / 1.25e8;
  const double push_part = 500e-6 + 4.2e6 / 1.25e8;  // one round: no acknowledgement
  CHECK(h.step_seconds ==
        Approx(0.012 + push_part + std::max(ring_part, pull_part)).epsilon(1e-12));
}

TEST_CASE("advise ranks by predicted step time and names why") {
  const plan::measured_step probes[] = {ps_probe(), ring_probe()};
  // Fast network: compute decides; the ring probe computes less.
  auto fast = plan::advise(probes, {1.25e9, 50e-6});
  REQUIRE(fast.ranked.size() == 2);
  CHECK(fast.ranked[0].probe.strategy == "allreduce");
  CHECK(fast.reason.find("allreduce with none") == 0);
  CHECK(fast.reason.find("compute-bound") != std::string::npos);
  CHECK(fast.reason.find("busiest server carries") != std::string::npos);
  // A slow network and a ring that moves far more: the servers win.
  auto heavy_ring = ring_probe();
  heavy_ring.ring_bytes = 40e6;
  const plan::measured_step slow_probes[] = {heavy_ring, ps_probe()};
  auto slow = plan::advise(slow_probes, {1.25e8, 500e-6});
  CHECK(slow.ranked[0].probe.strategy == "ps");
  CHECK(slow.reason.find("network-bound") != std::string::npos);
}

TEST_CASE("the advisor refuses what it cannot model") {
  const plan::network net{};
  auto bad = ring_probe();
  bad.strategy = "gossip";
  CHECK_THROWS_WITH(plan::predict(bad, net), Catch::Contains("allreduce, ps or hybrid"));
  auto no_servers = ps_probe();
  no_servers.servers = 0;
  CHECK_THROWS_WITH(plan::predict(no_servers, net), Catch::Contains("at least one server"));
  auto negative = ring_probe();
  negative.ring_bytes = -1;
  CHECK_THROWS_WITH(plan::predict(negative, net), Catch::Contains("finite and >= 0"));
  auto waits_too_long = ps_probe();
  waits_too_long.server_wait_seconds = 1;
  CHECK_THROWS_WITH(plan::predict(waits_too_long, net), Catch::Contains("cannot exceed"));
  auto nan_time = ring_probe();
  nan_time.local_seconds = std::nan("");
  CHECK_THROWS_AS(plan::predict(nan_time, net), strata::error);
  CHECK_THROWS_WITH(plan::predict(ring_probe(), {0, 50e-6}), Catch::Contains("bandwidth"));
  CHECK_THROWS_WITH(plan::predict(ring_probe(), {1e9, -1}), Catch::Contains("latency"));
  CHECK_THROWS_WITH(plan::advise({}, net), Catch::Contains("no candidates"));
}

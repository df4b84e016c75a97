// The MPI transport under mpiexec (2, 3 and 4 processes): the shared suite on both transports,
// then what only MPI has (environment, tag mapping, native_allreduce, roles).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <set>
#include <vector>

#include "mpi/harness.hpp"
#include "mpi/suite.hpp"
#include "strata/mpi/environment.hpp"
#include "strata/mpi/native_allreduce.hpp"
#include "strata/mpi/roles.hpp"
#include "strata/mpi/transport.hpp"

using namespace strata;
using mpi_suite::ensure;
using mpi_suite::ensure_error;
using mpi_test::on_both_transports;

TEST_CASE("the environment provides MPI_THREAD_MULTIPLE", "[mpi]") {
  mpi::environment again;  // MPI is already initialised: checks the level, owns nothing
  CHECK_FALSE(again.owns());
  CHECK(again.provided() == mpi::threading::multiple);
  CHECK(mpi::environment::world_size() >= 2);
  CHECK_FALSE(mpi::environment::library_version().empty());
  CHECK(mpi::to_string(mpi::threading::funneled) == "MPI_THREAD_FUNNELED");
}

TEST_CASE("strata tags map one-to-one into MPI's tag range", "[mpi]") {
  using comm::reserved_tag_base;
  for (int ub : {32767, 2147483647}) {
    const std::int64_t half = (std::int64_t{ub} + 1) / 2;
    CHECK(mpi::to_mpi_tag(0, ub) == 0);
    CHECK(mpi::to_mpi_tag(static_cast<comm::tag_t>(half - 1), ub) == half - 1);
    CHECK_THROWS_WITH(mpi::to_mpi_tag(static_cast<comm::tag_t>(half), ub),
                      Catch::Contains("user tags must be below"));
    const std::vector<comm::tag_t> reserved = {
        comm::tags::allreduce,  comm::tags::allreduce_check, comm::tags::allgather,
        comm::tags::broadcast,  comm::tags::barrier,         comm::tags::compressed_allreduce,
        comm::tags::ps_request, comm::tags::ps_reply,        reserved_tag_base};
    std::set<int> seen;
    for (comm::tag_t tag : reserved) {
      const int m = mpi::to_mpi_tag(tag, ub);
      CHECK(m >= half);
      CHECK(m <= ub);
      seen.insert(m);
    }
    CHECK(seen.size() == reserved.size());
    CHECK(mpi::to_mpi_tag(static_cast<comm::tag_t>(reserved_tag_base + (ub - half)), ub) == ub);
    CHECK_THROWS_AS(
        mpi::to_mpi_tag(static_cast<comm::tag_t>(reserved_tag_base + (ub - half) + 1), ub), error);
  }
}

TEST_CASE("roles: --servers S makes the last S ranks servers", "[mpi][ps]") {
  const char* three[] = {"prog", "--lr", "0.1", "--servers", "2"};
  const auto roles = mpi::layout_from_args(5, three, 5);
  CHECK(roles.kind() == ps::placement::dedicated);
  CHECK(roles.workers() == 3);
  CHECK(roles.server_rank(0) == 3);
  CHECK(roles.server_rank(1) == 4);
  const char* equals[] = {"prog", "--servers=1"};
  CHECK(mpi::layout_from_args(2, equals, 4).servers() == 1);
  const char* none[] = {"prog"};
  CHECK(mpi::layout_from_args(1, none, 4).kind() == ps::placement::colocated);
  const char* zero[] = {"prog", "--servers", "0"};
  CHECK(mpi::layout_from_args(3, zero, 4).kind() == ps::placement::colocated);
  const char* all[] = {"prog", "--servers", "4"};
  CHECK_THROWS_WITH(mpi::layout_from_args(3, all, 4), Catch::Contains("leaves no worker"));
  const char* bad[] = {"prog", "--servers", "two"};
  CHECK_THROWS_WITH(mpi::layout_from_args(3, bad, 4), Catch::Contains("non-negative integer"));
  const char* missing[] = {"prog", "--servers"};
  CHECK_THROWS_WITH(mpi::layout_from_args(2, missing, 4), Catch::Contains("needs a number"));
}

TEST_CASE("ring allreduce, allgather, broadcast, barrier on both transports", "[mpi][comm]") {
  on_both_transports([](auto& t) {
    mpi_suite::ring_allreduce_matches_reference<float>(t);
    mpi_suite::ring_allreduce_matches_reference<double>(t);
    mpi_suite::ring_allreduce_matches_reference<std::int32_t>(t);
    mpi_suite::ring_allreduce_matches_reference<std::int64_t>(t);
    mpi_suite::gather_broadcast_barrier(t);
  });
}

TEST_CASE("compressed allreduce (int8_block<256>) on both transports", "[mpi][compress]") {
  on_both_transports([](auto& t) { mpi_suite::compressed_allreduce_within_bound(t); });
}

TEST_CASE("ring allreduce moves 2(N-1)/N of the bytes on both transports", "[mpi][comm]") {
  on_both_transports([](auto& t) { mpi_suite::ring_sends_two_n_minus_one_over_n(t); });
}

TEST_CASE("point to point: order, any size, overtaking, recv_any", "[mpi][comm]") {
  on_both_transports([](auto& t) { mpi_suite::point_to_point(t); });
}

TEST_CASE("two threads share one endpoint", "[mpi][comm]") {
  on_both_transports([](auto& t) { mpi_suite::two_threads_one_endpoint(t); });
}

TEST_CASE("wrong sizes raise size_mismatch naming rank, peer and tag", "[mpi][comm]") {
  on_both_transports([](auto& t) { mpi_suite::size_mismatches(t); });
}

TEST_CASE("a message that never comes times out naming peer and tag", "[mpi][comm]") {
  on_both_transports([](auto& t) { mpi_suite::timeout_names_peer_and_tag(t); });
}

TEST_CASE("native_allreduce equals the ring", "[mpi][native]") {
  mpi::transport t({.timeout_seconds = mpi_test::timeout_seconds});
  const int n = t.size();
  for (std::size_t count : {0u, 1u, 7u, 1000u, 100003u}) {
    INFO("count " << count);
    std::vector<float> ring(count), native(count);
    for (std::size_t i = 0; i < count; ++i)
      ring[i] = native[i] = mpi_suite::value_for<float>(t.rank(), i);
    std::vector<float> ring_mean = ring, native_mean = native;
    comm::ring_allreduce{}(t, std::span(ring), comm::reduce_op::sum);
    mpi::native_allreduce{}(t, std::span(native), comm::reduce_op::sum);
    comm::ring_allreduce{}(t, std::span(ring_mean), comm::reduce_op::mean);
    mpi::native_allreduce{.max_elements_per_call = 999, .poll = true}(t, std::span(native_mean),
                                                                      comm::reduce_op::mean);
    double worst = 0;
    for (std::size_t i = 0; i < count; ++i) {
      double exact = 0;
      for (int r = 0; r < n; ++r)
        exact += mpi_suite::value_for<float>(r, i);
      worst = std::max(worst, std::abs(native[i] - ring[i]) / (1 + std::abs(exact)));
      worst = std::max(worst, std::abs(native_mean[i] - ring_mean[i]) / (1 + std::abs(exact)));
      worst = std::max(worst, std::abs(native[i] - exact) / (1 + std::abs(exact)));
    }
    CHECK(worst < 1e-5);
  }
  std::vector<std::int64_t> ints(1001), expected(1001, 0);
  for (std::size_t i = 0; i < ints.size(); ++i) {
    ints[i] = mpi_suite::value_for<std::int64_t>(t.rank(), i);
    for (int r = 0; r < n; ++r)
      expected[i] += mpi_suite::value_for<std::int64_t>(r, i);
  }
  mpi::native_allreduce{}(t, std::span(ints));
  CHECK(ints == expected);
  std::vector<double> ones(5, 1.0);
  mpi::native_allreduce{}(t, std::span(ones), comm::reduce_op::mean);
  CHECK(ones == std::vector<double>(5, 1.0));
}

TEST_CASE("native_allreduce of different lengths fails on every rank", "[mpi][native]") {
  mpi::transport t({.timeout_seconds = mpi_test::timeout_seconds});
  std::vector<float> data(10 + static_cast<std::size_t>(t.rank() == 1), 1.0f);
  REQUIRE_NOTHROW(ensure_error([&] { mpi::native_allreduce{}(t, std::span(data)); },
                               errc::size_mismatch,
                               {"native_allreduce of", "from 10 to 11", "same length"}));
  CHECK_THROWS_WITH(mpi::native_allreduce{.max_elements_per_call = 0}(t, std::span(data)),
                    Catch::Contains("max_elements_per_call"));
}

TEST_CASE("bad peers, tags and options are refused", "[mpi][comm]") {
  mpi::transport t({.timeout_seconds = mpi_test::timeout_seconds});
  const std::byte b{1};
  CHECK_THROWS_WITH(t.send(t.size(), 1, std::span(&b, 1)), Catch::Contains("outside the world"));
  CHECK_THROWS_WITH(t.recv_message(-2, 1), Catch::Contains("outside the world"));
  CHECK_THROWS_WITH(t.bytes_sent_to(-1), Catch::Contains("outside the world"));
  CHECK_THROWS_WITH(t.send(0, comm::reserved_tag_base - 1, std::span(&b, 1)),
                    Catch::Contains("does not fit"));
  CHECK_THROWS_WITH(t.set_timeout(0), Catch::Contains("positive"));
  CHECK_THROWS_WITH(mpi::transport({.timeout_seconds = -1}), Catch::Contains("positive"));
  // A send to ourselves is buffered and flushed once received.
  t.send(t.rank(), 9, std::span(&b, 1));
  std::byte back{};
  t.recv(t.rank(), 9, std::span(&back, 1));
  t.flush();
  CHECK(t.pending_sends() == 0);
  CHECK(back == b);
}

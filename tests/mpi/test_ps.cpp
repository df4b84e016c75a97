// Parameter server over MPI: 1 server + 2 workers (3 processes), sync consistency, equals
// single-process training with embedding::local — and the same body on thread_world.
#include <catch2/catch.hpp>

#include "mpi/harness.hpp"
#include "mpi/suite.hpp"
#include "support/skip.hpp"

TEST_CASE("PS pull/push over MPI equals single-process training", "[mpi][ps]") {
  if (strata::mpi::environment::world_size() != 3) {
    strata_test::skip("the PS test needs 3 processes (2 workers + 1 server)");
    return;
  }
  mpi_test::on_both_transports([](auto& t) { mpi_suite::ps_sync_equals_local(t); });
}

/// @file harness.hpp
/// Runs one suite body (tests/mpi/suite.hpp) on both transports: this process's rank of an
/// `mpi::transport` (a fresh communicator per call), then — on rank 0 only — on a
/// `thread_world` with as many ranks as the MPI job.
#pragma once

#include <catch2/catch.hpp>

#include "mpi/suite.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/mpi/environment.hpp"
#include "strata/mpi/transport.hpp"

namespace mpi_test {

inline constexpr double timeout_seconds = 10;

/// Runs `body(t)` on `mpi::transport`, then on `thread_world` (rank 0 of the job only).
template <class Body>
void on_both_transports(Body body) {
  {
    INFO("mpi::transport, rank " << strata::mpi::environment::world_rank());
    strata::mpi::transport t({.timeout_seconds = timeout_seconds});
    REQUIRE_NOTHROW(body(t));
  }
  if (strata::mpi::environment::world_rank() != 0) return;
  INFO("thread_world");
  strata::comm::thread_world world(strata::mpi::environment::world_size(),
                                   {.timeout_seconds = timeout_seconds});
  REQUIRE_NOTHROW(world.run([&](strata::comm::thread_transport& t) { body(t); }));
}

}  // namespace mpi_test

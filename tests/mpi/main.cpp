// Catch2 runner for tests under mpiexec: MPI (MPI_THREAD_MULTIPLE) lives for the whole run.
// Every rank runs every test case in declaration order (no --order rand: the test cases are
// collective, so all ranks must enter them in the same order).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "strata/mpi/environment.hpp"
#include "support/skip_runner.hpp"

// A rank on which a case skipped (strata_test::skip) and none failed exits with
// strata_test::skip_exit_code, which mpiexec passes on and ctest reports as skipped.
int main(int argc, char** argv) {
  strata::mpi::environment env(argc, argv);
  const int catch_result = Catch::Session().run(argc, argv);
  return strata_test::skips().skipped_cases.load() == 0 ? catch_result : strata_test::exit_code();
}

// Catch2 runner for tests under mpiexec: MPI (MPI_THREAD_MULTIPLE) lives for the whole run.
// Every rank runs every test case in declaration order (no --order rand: the test cases are
// collective, so all ranks must enter them in the same order).
#include "strata/mpi/environment.hpp"
#include "support/catch_session.hpp"

// A rank on which a case skipped (strata_test::skip) and none failed exits with
// strata_test::skip_exit_code, which mpiexec passes on and ctest reports as skipped.
int main(int argc, char** argv) {
  strata::mpi::environment env(argc, argv);
  return strata_test::run_catch_session(argc, argv);
}

// Catch2's session, compiled once (support/catch_session.cpp) for every test runner: the
// tests' own (support/main.cpp) and the MPI tests' (mpi/main.cpp). Catch2's implementation is
// the slowest file of the test build (30 s); each runner compiled it before.
#pragma once

namespace strata_test {

/// Runs the test cases that argv selects, with the skip listener (support/skip_runner.hpp);
/// returns the program's exit code: Catch's result (which also covers a bad command line or
/// --list), 1 when no case ran (the filter matched none), or strata_test::exit_code() when some
/// case skipped.
int run_catch_session(int argc, char** argv);

}  // namespace strata_test

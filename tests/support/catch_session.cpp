// Catch2's implementation and the skip listener, once for every test runner
// (support/catch_session.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "support/catch_session.hpp"
#include "support/skip_runner.hpp"

int strata_test::run_catch_session(int argc, char** argv) {
  const int catch_result = Catch::Session().run(argc, argv);
  if (catch_result == 0 && strata_test::ran_no_case()) {
    std::fputs(
        "no test case ran: the test filter matched none (a renamed test file?); a test "
        "program that runs nothing fails\n",
        stderr);
    return 1;
  }
  return skips().skipped_cases.load() == 0 ? catch_result : exit_code();
}

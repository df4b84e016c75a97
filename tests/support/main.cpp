// Catch2's runner for strata's tests: Catch's own, except that a program in which some case
// skipped (strata_test::skip) and none failed exits with strata_test::skip_exit_code, which
// ctest reports as "Skipped" (SKIP_RETURN_CODE), not as a pass.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <iostream>

#include "support/skip_runner.hpp"

int main(int argc, char** argv) {
  const int catch_result = Catch::Session().run(argc, argv);
  // Without a skip, Catch's own result (it also covers a bad command line or --list).
  const int result =
      strata_test::skips().skipped_cases.load() == 0 ? catch_result : strata_test::exit_code();
  if (result == strata_test::skip_exit_code)
    std::cout << "SKIP: " << strata_test::skips().skipped_cases.load()
              << " test case(s) could not run on this machine (see the SKIP lines above)\n";
  return result;
}

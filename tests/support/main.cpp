// Catch2's runner for strata's tests: Catch's own, except that a program in which some case
// skipped (strata_test::skip) and none failed exits with strata_test::skip_exit_code, which
// ctest reports as "Skipped" (SKIP_RETURN_CODE), not as a pass.
#include <iostream>

#include "support/catch_session.hpp"
#include "support/skip.hpp"

int main(int argc, char** argv) {
  const int result = strata_test::run_catch_session(argc, argv);
  if (result == strata_test::skip_exit_code)
    std::cout << "SKIP: " << strata_test::skips().skipped_cases.load()
              << " test case(s) could not run on this machine (see the SKIP lines above)\n";
  return result;
}

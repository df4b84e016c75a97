// Catch2's implementation and the skip listener, once for every test runner
// (support/catch_session.hpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_session.hpp"
#include "support/skip_runner.hpp"

int strata_test::run_catch_session(int argc, char** argv) {
  const int catch_result = Catch::Session().run(argc, argv);
  return skips().skipped_cases.load() == 0 ? catch_result : exit_code();
}

// The program tests/support/check_skip.cmake runs to check strata_test::skip's exit codes:
// a skip alone exits 77, a skip next to or after a failure fails, passing cases alone exit 0.
#include <catch2/catch.hpp>

#include "support/skip.hpp"

TEST_CASE("a case that passes", "[passes]") {
  REQUIRE(1 + 1 == 2);
}

TEST_CASE("a case that cannot run here", "[skips]") {
  strata_test::skip("the probe skips on purpose");
}

TEST_CASE("a case that fails", "[.][fails]") {
  REQUIRE(1 + 1 == 3);
}

TEST_CASE("a case that fails, then skips", "[.][fails_then_skips]") {
  CHECK(1 + 1 == 3);
  strata_test::skip("a skip does not excuse a failed assertion");
}

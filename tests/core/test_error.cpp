#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "strata/core/error.hpp"

using namespace strata;

namespace {
int checked_sqrt_floor(int x) {
  STRATA_EXPECTS(x >= 0, "checked_sqrt_floor: x is ", x, ", needs x >= 0");
  int r = 0;
  while ((r + 1) * (r + 1) <= x)
    ++r;
  return r;
}
}  // namespace

TEST_CASE("every error code has a distinct name", "[core][error]") {
  const errc all[] = {errc::invalid_argument, errc::out_of_range, errc::size_mismatch,
                      errc::timeout,          errc::aborted,      errc::bad_message,
                      errc::io_error,         errc::corrupt_data, errc::unsupported,
                      errc::internal};
  std::vector<std::string_view> names;
  for (errc code : all) {
    const auto name = to_string(code);
    REQUIRE(!name.empty());
    REQUIRE(name != "unknown");
    REQUIRE(std::find(names.begin(), names.end(), name) == names.end());
    names.push_back(name);
  }
  REQUIRE(to_string(errc::size_mismatch) == "size_mismatch");
  REQUIRE(to_string(static_cast<errc>(999)) == "unknown");
}

TEST_CASE("strata::error carries its code and a prefixed message", "[core][error]") {
  const error e(errc::timeout, "rank 1: recv from peer 0 timed out");
  REQUIRE(e.code() == errc::timeout);
  REQUIRE(std::string(e.what()) == "strata timeout: rank 1: recv from peer 0 timed out");
  // It is a std::runtime_error, so generic handlers see it.
  const std::runtime_error& base = e;
  REQUIRE(std::string(base.what()).find("timed out") != std::string::npos);
}

TEST_CASE("fail() throws strata::error with the given code", "[core][error]") {
  try {
    fail(errc::corrupt_data, cat("checkpoint ", "a.bin", ": checksum ", 0x10, " != ", 17));
    FAIL("fail() returned");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::corrupt_data);
    REQUIRE_THAT(e.what(), Catch::Contains("checkpoint a.bin: checksum 16 != 17"));
  }
}

TEST_CASE("cat() streams mixed parts", "[core][error]") {
  REQUIRE(cat("rank ", 3, " of ", 4u, " x=", 1.5, ' ', std::string("s")) == "rank 3 of 4 x=1.5 s");
  REQUIRE(cat() == "");
}

TEST_CASE("STRATA_EXPECTS names the message, the condition and file:line", "[core][error]") {
  REQUIRE(checked_sqrt_floor(17) == 4);
  int line = 0;
  try {
    line = __LINE__ + 1;
    STRATA_EXPECTS(line < 0, "line is ", line, "; what to do: pass a negative line");
    FAIL("no throw");
  } catch (const error& e) {
    const std::string text = e.what();
    REQUIRE(e.code() == errc::invalid_argument);
    CHECK_THAT(text, Catch::StartsWith("strata invalid_argument: line is "));
    CHECK_THAT(text, Catch::Contains("what to do: pass a negative line"));
    CHECK_THAT(text, Catch::Contains("`line < 0`"));
    CHECK_THAT(text, Catch::Contains(cat("test_error.cpp:", line)));
  }
  REQUIRE_THROWS_WITH(checked_sqrt_floor(-2), Catch::Contains("x is -2") &&
                                                  Catch::Contains("`x >= 0`") &&
                                                  Catch::Contains("test_error.cpp:"));
}

TEST_CASE("STRATA_EXPECTS builds its message only on failure", "[core][error]") {
  int built = 0;
  const auto costly = [&] {
    ++built;
    return "x";
  };
  STRATA_EXPECTS(true, costly());
  REQUIRE(built == 0);
  REQUIRE_THROWS_AS([&] { STRATA_EXPECTS(false, costly()); }(), error);
  REQUIRE(built == 1);
}

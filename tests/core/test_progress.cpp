#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "strata/core/progress.hpp"

using namespace strata;

TEST_CASE("format_duration picks h/m/s units", "[core][progress]") {
  REQUIRE(format_duration(0) == "0.0s");
  REQUIRE(format_duration(4.2) == "4.2s");
  REQUIRE(format_duration(59.94) == "59.9s");
  REQUIRE(format_duration(60) == "1m00s");
  REQUIRE(format_duration(185) == "3m05s");
  REQUIRE(format_duration(3599) == "59m59s");
  REQUIRE(format_duration(3600) == "1h00m");
  REQUIRE(format_duration(3725) == "1h02m");
  REQUIRE(format_duration(-1) == "?");
  REQUIRE(format_duration(std::numeric_limits<double>::infinity()) == "?");
  REQUIRE(format_duration(std::numeric_limits<double>::quiet_NaN()) == "?");
}

TEST_CASE("progress line shows count, percent, rate and eta when the total is known",
          "[core][progress]") {
  progress bar("train", 200, "batch", 1e9);  // never prints by itself during the test
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  bar.update(50);
  const std::string text = bar.line("loss 0.45");
  INFO(text);
  REQUIRE_THAT(text, Catch::StartsWith("train 50/200 ( 25%) "));
  REQUIRE_THAT(text, Catch::Contains(" batch/s elapsed "));
  REQUIRE_THAT(text, Catch::Contains(" eta "));
  REQUIRE_THAT(text, !Catch::Contains("eta ?"));
  REQUIRE_THAT(text, Catch::EndsWith("  loss 0.45"));
  // rate = 50 / elapsed, so it is positive and below 50 / 0.02 s
  const auto at = text.find(") ") + 2;
  const double rate = std::stod(text.substr(at));
  REQUIRE(rate > 0);
  REQUIRE(rate <= 50 / 0.02);
}

TEST_CASE("progress line without a total has no eta", "[core][progress]") {
  progress bar("read", 0, "rows", 1e9);
  bar.update(7);
  const std::string text = bar.line();
  REQUIRE_THAT(text, Catch::StartsWith("read 7 "));
  REQUIRE_THAT(text, Catch::Contains("rows/s elapsed"));
  REQUIRE_THAT(text, !Catch::Contains("eta"));
}

TEST_CASE("eta is unknown before any work is done", "[core][progress]") {
  progress bar("eval", 10, "it", 1e9);
  REQUIRE_THAT(bar.line(), Catch::Contains("0/10") && Catch::Contains("eta ?"));
}

TEST_CASE("long labels are not truncated", "[core][progress]") {
  const std::string label(300, 'x');
  progress bar(label, 5, "it", 1e9);
  bar.update(1);
  const std::string text = bar.line();
  REQUIRE_THAT(text, Catch::StartsWith(label + " 1/5"));
  REQUIRE_THAT(text, Catch::Contains("eta "));
}

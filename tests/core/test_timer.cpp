#include <catch2/catch.hpp>

#include <chrono>
#include <thread>

#include "strata/core/timer.hpp"

using namespace strata;
using namespace std::chrono_literals;

TEST_CASE("stopwatch measures elapsed time and laps", "[core][timer]") {
  stopwatch watch;
  std::this_thread::sleep_for(20ms);
  const double first = watch.seconds();
  REQUIRE(first >= 0.02);
  REQUIRE(first < 2.0);
  REQUIRE(watch.seconds() >= first);  // monotonic
  const double lap = watch.lap();
  REQUIRE(lap >= first);
  REQUIRE(watch.seconds() < lap);  // the lap restarted the clock
  watch.restart();
  REQUIRE(watch.seconds() < 0.02);
}

TEST_CASE("phase_timer adds time to phases", "[core][timer]") {
  phase_timer<3> timer;
  std::this_thread::sleep_for(10ms);
  timer.mark(0);
  std::this_thread::sleep_for(30ms);
  timer.skip();
  std::this_thread::sleep_for(20ms);
  timer.mark(2);
  std::this_thread::sleep_for(5ms);
  timer.mark(0);
  REQUIRE(timer.seconds(0) >= 0.015);
  REQUIRE(timer.seconds(1) == 0.0);
  REQUIRE(timer.seconds(2) >= 0.02);
  REQUIRE(timer.seconds(2) < 0.03 + 1.0);  // the skipped 30 ms are not in phase 2 (loose bound)
  REQUIRE(timer.total() == Approx(timer.seconds(0) + timer.seconds(2)));
  REQUIRE(timer.total() < 2.0);
  timer.reset();
  REQUIRE(timer.total() == 0.0);
  timer.mark(1);
  REQUIRE(timer.seconds(1) < 0.05);
}

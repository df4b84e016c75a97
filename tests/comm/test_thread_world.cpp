#include <catch2/catch.hpp>

#include <chrono>
#include <cstring>
#include <thread>

#include "strata/comm.hpp"
#include "strata/core/timer.hpp"

using namespace strata;
using namespace strata::comm;

namespace {
std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span(s));
}
}  // namespace

TEST_CASE("tagged send and receive keep order per tag", "[comm][thread_world]") {
  thread_world world(2);
  world.run([](thread_transport& t) {
    if (t.rank() == 0) {
      t.send(1, 7, bytes_of("first"));
      t.send(1, 8, bytes_of("other tag"));
      t.send(1, 7, bytes_of("second"));
    } else {
      auto other = t.recv_message(0, 8);  // out of order across tags is fine
      REQUIRE(std::string(reinterpret_cast<const char*>(other.data()), other.size()) ==
              "other tag");
      auto a = t.recv_message(0, 7);
      auto b = t.recv_any(7);
      REQUIRE(std::string(reinterpret_cast<const char*>(a.data()), a.size()) == "first");
      REQUIRE(b.source == 0);
      REQUIRE(std::string(reinterpret_cast<const char*>(b.bytes.data()), b.bytes.size()) ==
              "second");
      REQUIRE(t.bytes_received_from(0) == 5 + 9 + 6);
    }
  });
  REQUIRE(world.bytes_sent(0, 1) == 20);
}

TEST_CASE("a peer that never answers times out naming rank, peer and tag", "[comm][thread_world]") {
  thread_world world(2, {.timeout_seconds = 0.2});
  stopwatch watch;
  REQUIRE_THROWS_WITH(world.run([](thread_transport& t) {
    if (t.rank() == 1) {
      std::byte b{};
      t.recv(0, 42, std::span(&b, 1));
    }
  }),
                      Catch::Contains("rank 1") && Catch::Contains("peer 0") &&
                          Catch::Contains("tag 42") && Catch::Contains("timed out"));
  REQUIRE(watch.seconds() < 5);
}

TEST_CASE("an exception in one rank stops the world with that error", "[comm][thread_world]") {
  thread_world world(4, {.timeout_seconds = 30});
  stopwatch watch;
  REQUIRE_THROWS_WITH(world.run([](thread_transport& t) {
    if (t.rank() == 2) throw std::runtime_error("rank 2 exploded");
    std::byte b{};
    t.recv((t.rank() + 1) % 4, 1, std::span(&b, 1));  // would wait forever
  }),
                      "rank 2 exploded");
  REQUIRE(watch.seconds() < 5);  // not the 30 s timeout
}

TEST_CASE("wrong message size is an error", "[comm][thread_world]") {
  thread_world world(2, {.timeout_seconds = 5});
  REQUIRE_THROWS_WITH(world.run([](thread_transport& t) {
    if (t.rank() == 0) {
      t.send(1, 3, bytes_of("12345"));
    } else {
      std::array<std::byte, 4> small{};
      t.recv(0, 3, small);
    }
  }),
                      Catch::Contains("has 5 bytes but 4 were expected"));
}

TEST_CASE("bad peers are rejected", "[comm][thread_world]") {
  REQUIRE_THROWS_AS(thread_world(0), strata::error);
  thread_world world(2);
  REQUIRE_THROWS_WITH(world.run([](thread_transport& t) { t.send(2, 1, bytes_of("x")); }),
                      Catch::Contains("outside the world of 2 ranks"));
}

TEST_CASE("link emulation delays messages by latency and bandwidth", "[comm][thread_world]") {
  // 1 MB over a 100 MB/s link with 20 ms latency: at least 30 ms.
  thread_world world(2, {.link = {.latency_seconds = 0.02, .bandwidth_bytes_per_second = 100e6}});
  double elapsed = 0;
  world.run([&](thread_transport& t) {
    std::vector<std::byte> payload(1'000'000);
    barrier(t);
    stopwatch watch;
    if (t.rank() == 0) {
      t.send(1, 1, payload);
    } else {
      t.recv(0, 1, payload);
      elapsed = watch.seconds();
    }
  });
  REQUIRE(elapsed >= 0.029);
  REQUIRE(elapsed < 2.0);
}

TEST_CASE("injected fault stops every rank", "[comm][thread_world]") {
  thread_world world(3, {.timeout_seconds = 10, .fail_on_send = {0, 2, 0}});
  REQUIRE_THROWS_WITH(world.run([](thread_transport& t) {
    std::vector<float> g(100, 1.0f);
    for (int i = 0; i < 10; ++i)
      allreduce(t, std::span(g));
  }),
                      Catch::Contains("injected fault"));
}

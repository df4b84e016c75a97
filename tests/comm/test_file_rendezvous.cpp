#include <catch2/catch.hpp>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm/file_rendezvous.hpp"
#include "strata/core/error.hpp"

#include "support/temp_dir.hpp"

using namespace strata;
namespace fs = std::filesystem;

namespace {
std::vector<std::byte> pattern(std::size_t n) {
  std::vector<std::byte> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = static_cast<std::byte>((i * 131 + 7) & 0xFF);
  return v;
}

errc code_of(auto&& call) {
  try {
    call();
  } catch (const error& e) {
    return e.code();
  }
  FAIL("no strata::error");
  return errc::internal;
}
}  // namespace

TEST_CASE("file rendezvous hands the publisher's bytes to every waiting rank",
          "[comm][rendezvous]") {
  const strata_test::temp_dir dir("rendezvous");
  const fs::path where = dir.path / "nccl.id";
  const auto sent = pattern(128);  // the size of an ncclUniqueId
  std::vector<std::vector<std::byte>> got(3, std::vector<std::byte>(128));
  std::vector<std::thread> waiters;
  for (auto& g : got)
    waiters.emplace_back([&where, &g] { comm::await_file(where, g, 30.0); });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the waiters poll first
  comm::publish_file(where, sent);
  for (auto& w : waiters)
    w.join();
  for (const auto& g : got)
    REQUIRE(g == sent);
  // Nothing but the file is left behind (the temporary was renamed).
  REQUIRE(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator{}) == 1);
  // A late rank reads it too.
  std::vector<std::byte> late(128);
  comm::await_file(where, late, 1.0);
  REQUIRE(late == sent);
}

TEST_CASE("file rendezvous: bad situations raise clear errors", "[comm][rendezvous]") {
  const strata_test::temp_dir dir("rendezvous");
  const fs::path where = dir.path / "id";
  std::vector<std::byte> out(16);
  SECTION("no publisher: timeout naming the path, not a hang") {
    const auto start = std::chrono::steady_clock::now();
    REQUIRE_THROWS_WITH(comm::await_file(where, out, 0.2),
                        Catch::Contains(where.string()) && Catch::Contains("did not appear"));
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
    REQUIRE(code_of([&] { comm::await_file(where, out, 0.05); }) == errc::timeout);
  }
  SECTION("a leftover file is never overwritten (its stale content could be taken)") {
    comm::publish_file(where, pattern(16));
    REQUIRE(code_of([&] { comm::publish_file(where, pattern(16)); }) == errc::invalid_argument);
    REQUIRE_THROWS_WITH(comm::publish_file(where, pattern(16)), Catch::Contains("already exists"));
  }
  SECTION("a file of the wrong size is refused") {
    comm::publish_file(where, pattern(15));
    REQUIRE(code_of([&] { comm::await_file(where, out, 1.0); }) == errc::corrupt_data);
    REQUIRE_THROWS_WITH(comm::await_file(where, out, 1.0),
                        Catch::Contains("holds 15 bytes, expected 16"));
  }
  SECTION("an unwritable folder") {
    REQUIRE(code_of([&] { comm::publish_file(dir.path / "missing" / "id", pattern(4)); }) ==
            errc::io_error);
  }
  SECTION("a non-positive timeout") {
    REQUIRE(code_of([&] { comm::await_file(where, out, 0.0); }) == errc::invalid_argument);
  }
}

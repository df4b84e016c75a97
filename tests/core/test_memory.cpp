#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <cstdint>
#include <memory>
#include <new>

#include "strata/core/memory.hpp"
#include "support/skip.hpp"

using namespace strata;

namespace {
/// Sets the soft limit `which` for the scope, then restores it.
class scoped_limit {
 public:
  scoped_limit(int which, rlim_t soft) : which_(which) {
    REQUIRE(::getrlimit(which_, &old_) == 0);
    rlimit r = old_;
    r.rlim_cur = soft;
    REQUIRE(::setrlimit(which_, &r) == 0);
  }
  ~scoped_limit() { ::setrlimit(which_, &old_); }
  scoped_limit(const scoped_limit&) = delete;
  scoped_limit& operator=(const scoped_limit&) = delete;

 private:
  int which_;
  rlimit old_{};
};

/// Where allocations escape, so the compiler cannot elide them.
void* volatile sink = nullptr;

/// Whether `bytes` can be allocated and touched now.
bool can_allocate(std::uint64_t bytes) {
  try {
    const std::unique_ptr<char[]> p(new char[bytes]);
    sink = p.get();
    volatile char* touch = p.get();
    for (std::uint64_t i = 0; i < bytes; i += 4096)
      touch[i] = 1;
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}
}  // namespace

TEST_CASE("current_process_memory reads VmSize, VmData and VmRSS", "[core][memory]") {
  const auto m = current_process_memory();
  CHECK(m.address_space > 0);
  CHECK(m.data > 0);
  CHECK(m.resident > 0);
  CHECK(m.address_space >= m.resident);
  const auto grown = [&] {
    const std::unique_ptr<char[]> p(new char[64 << 20]);
    sink = p.get();
    return current_process_memory().address_space;
  }();
  CHECK(grown >= m.address_space + (60u << 20));
}

TEST_CASE("the headroom is the least of physical memory, RLIMIT_AS and RLIMIT_DATA",
          "[core][memory]") {
  const auto free_run = current_memory_headroom();
  REQUIRE(!free_run.source.empty());
  CHECK(free_run.bytes <= free_run.limit);
  CHECK_THAT(free_run.describe(), Catch::Contains(free_run.source) && Catch::Contains(" MiB"));

  if (strata_test::sanitized()) {
    strata_test::skip("sanitizer build: its shadow memory and allocator defeat address limits");
    return;
  }
  constexpr std::uint64_t mib = 1 << 20;
  // Measured under the limit, checked once it is lifted (Catch2 allocates as it reports).
  SECTION("RLIMIT_AS: what is left of the address space, and really no more") {
    const std::uint64_t now = current_process_memory().address_space;
    memory_headroom room;
    bool below = false, above = true;
    {
      const scoped_limit limit(RLIMIT_AS, now + 256 * mib);
      room = current_memory_headroom();
      below = can_allocate(room.bytes - 16 * mib);
      above = can_allocate(room.bytes + 16 * mib);
    }
    CHECK(room.source == "RLIMIT_AS");
    CHECK(room.limit == now + 256 * mib);
    CHECK(room.bytes <= 256 * mib);
    CHECK(room.bytes >= 250 * mib);  // the /proc read itself maps little
    CHECK_THAT(room.describe(), Catch::Contains("RLIMIT_AS") && Catch::Contains("VmSize"));
    CHECK(below);
    CHECK_FALSE(above);
  }
  SECTION("RLIMIT_DATA: what is left of the data limit") {
    const std::uint64_t now = current_process_memory().data;
    memory_headroom room;
    bool above = true;
    {
      const scoped_limit limit(RLIMIT_DATA, now + 128 * mib);
      room = current_memory_headroom();
      above = can_allocate(room.bytes + 16 * mib);
    }
    CHECK(room.source == "RLIMIT_DATA");
    CHECK(room.bytes <= 128 * mib);
    CHECK(room.bytes >= 120 * mib);
    CHECK_FALSE(above);
  }
  SECTION("a limit below what is in use leaves nothing") {
    const std::uint64_t now = current_process_memory().address_space;
    std::uint64_t left = 1;
    {
      // Lowering the soft limit below use is allowed; nothing new can be mapped until restored.
      const scoped_limit limit(RLIMIT_AS, now / 2);
      left = current_memory_headroom().bytes;
    }
    CHECK(left == 0);
  }
}

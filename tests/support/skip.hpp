/// @file skip.hpp
/// Skipping a test case that cannot run on this machine (no GPU, no dataset, a sanitizer build)
/// so that ctest reports the test as skipped, never as passed.
///
/// A case calls `strata_test::skip(reason)` and returns. The runner (tests/support/main.cpp,
/// linked into every test program) exits with `skip_exit_code` when every case that ran either
/// passed or skipped and at least one skipped; the tests are registered with that code as their
/// SKIP_RETURN_CODE. A failure anywhere still fails the program.
#pragma once

#include <catch2/catch.hpp>

#include <atomic>
#include <string_view>

namespace strata_test {

/// The exit code meaning "nothing failed, something could not run here" (ctest's
/// SKIP_RETURN_CODE for every test program; 77 as in Automake).
inline constexpr int skip_exit_code = 77;

/// How many test cases of this program skipped (one counter per program: inline linkage).
inline std::atomic<int>& skipped_cases() {
  static std::atomic<int> count{0};
  return count;
}

/// Marks the running test case as skipped: prints "SKIP: <reason>" and records the skip. The
/// caller returns right after. Counts as the case's only assertion, so `--warn NoAssertions`
/// does not fail it.
inline void skip(std::string_view reason) {
  WARN("SKIP: " << reason);
  SUCCEED("skipped");
  skipped_cases().fetch_add(1, std::memory_order_relaxed);
}

/// The runner's exit code: Catch's result when something failed, else `skip_exit_code` when a
/// case skipped, else 0.
inline int exit_code(int catch_result) {
  if (catch_result != 0) return catch_result;
  return skipped_cases().load() > 0 ? skip_exit_code : 0;
}

}  // namespace strata_test

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
#include <cstdlib>
#include <string_view>

namespace strata_test {

/// The exit code meaning "nothing failed, something could not run here" (ctest's
/// SKIP_RETURN_CODE for every test program; 77 as in Automake).
inline constexpr int skip_exit_code = 77;

/// What the runner's listener (support/skip_runner.hpp) records while the cases run.
struct skip_record {
  std::atomic<int> skipped_cases{0};  ///< cases that called skip()
  std::atomic<int> failed_cases{0};   ///< cases that failed for a reason other than a skip
  std::atomic<bool> current_skipped{false};
};
inline skip_record& skips() {
  static skip_record record;
  return record;
}

/// Marks the running test case as skipped: prints "SKIP: <reason>" and records the skip; the
/// caller returns right after. The case is not counted as passed: the runner reports the
/// program as skipped, and forgives only the missing-assertion failure of `--warn
/// NoAssertions` that a skipped case causes, never a failed assertion.
inline void skip(std::string_view reason) {
  WARN("SKIP: " << reason);
  skips().current_skipped = true;
}

/// Whether this is a sanitizer build (compiled with ASan / TSan / MSan, or STRATA_SANITIZED set
/// by the sanitizer CI job): their shadow memory reserves terabytes of address space, and their
/// allocators abort instead of throwing std::bad_alloc, so address-space limits cannot be tested.
inline bool sanitized() {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  return true;
#else
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
  return true;
#endif
#endif
  return std::getenv("STRATA_SANITIZED") != nullptr;
#endif
}

/// The runner's exit code: 1 when a case failed (other than a skipped case's missing
/// assertion), else `skip_exit_code` when a case skipped, else 0.
inline int exit_code() {
  if (skips().failed_cases.load() > 0) return 1;
  return skips().skipped_cases.load() > 0 ? skip_exit_code : 0;
}

}  // namespace strata_test

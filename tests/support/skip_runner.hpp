// The listener behind strata_test::exit_code: included only by support/catch_session.cpp (after
// `#define CATCH_CONFIG_RUNNER` and <catch2/catch.hpp>, where Catch's listener base exists).
// Per case it records whether the case skipped and whether it failed for any other reason: a
// skipped case that trips `--warn NoAssertions` is not a failure, a failed assertion always is.
#pragma once

#include <catch2/catch.hpp>

#include "support/skip.hpp"

namespace strata_test {

/// Whether the run executed no test case: a filter that matched none, e.g. a grouped file's
/// "[#test_x]" tag (tests/CMakeLists.txt) after the file was renamed. Set when the run ends.
inline bool& ran_no_case() {
  static bool value = false;
  return value;
}

struct skip_listener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;

  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    skips().current_skipped = false;
    failed_assertions_ = 0;
    TestEventListenerBase::testCaseStarting(info);
  }
  bool assertionEnded(const Catch::AssertionStats& stats) override {
    if (!stats.assertionResult.isOk()) ++failed_assertions_;  // includes unexpected exceptions
    return TestEventListenerBase::assertionEnded(stats);
  }
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    const bool skipped = skips().current_skipped.load();
    if (skipped) ++skips().skipped_cases;
    // Catch counts a case without assertions as failed (--warn NoAssertions): excused for a
    // skipped case only.
    if (failed_assertions_ > 0 || (!skipped && stats.totals.testCases.failed > 0))
      ++skips().failed_cases;
    TestEventListenerBase::testCaseEnded(stats);
  }
  void testRunEnded(const Catch::TestRunStats& stats) override {
    ran_no_case() = stats.totals.testCases.total() == 0;
    TestEventListenerBase::testRunEnded(stats);
  }

 private:
  int failed_assertions_ = 0;
};

}  // namespace strata_test

using strata_test_skip_listener = strata_test::skip_listener;  // the macro takes a plain name
CATCH_REGISTER_LISTENER(strata_test_skip_listener)

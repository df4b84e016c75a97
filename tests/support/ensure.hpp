/// @file ensure.hpp
/// A check for code that runs on several threads at once (the ranks of a thread_world):
/// Catch2 v2's assertions are not thread-safe (two ranks asserting together corrupted its state
/// under ASan), so ranks call `ensure`, which throws; the world stops and run() rethrows the
/// message on the test's thread, where REQUIRE_NOTHROW or the test case reports it.
#pragma once

#include "strata/core/error.hpp"

namespace strata_test {

template <class... Parts>
void ensure(bool ok, const Parts&... parts) {
  if (!ok) strata::fail(strata::errc::internal, strata::cat("check failed: ", parts...));
}

}  // namespace strata_test

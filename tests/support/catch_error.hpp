// catch_error(fn): runs fn, which must throw strata::error, and returns that error (the test
// FAILs when nothing is thrown); contains(text, part). Shared by the tests that check what an
// error says.
#pragma once

#include <catch2/catch.hpp>

#include <string_view>

#include "strata/core/error.hpp"

namespace strata_test {

template <class Fn>
strata::error catch_error(Fn&& fn) {
  try {
    fn();
  } catch (const strata::error& e) {
    return e;
  }
  FAIL("expected strata::error");
  return strata::error(strata::errc::internal, "unreachable");
}

inline bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

}  // namespace strata_test

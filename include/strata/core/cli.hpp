/// @file cli.hpp
/// Strict parsing of command-line values: whole integers and finite reals inside a stated
/// range, names from a stated set. Every refusal is a strata::error (errc::invalid_argument)
/// naming the flag, the text given and what is accepted — a value is never narrowed, wrapped
/// or rounded into something the user did not type.
///
/// Integers may be written as decimal digits ("4096") or, for convenience with large counts, in
/// scientific notation that denotes a whole number ("1e6"); "1.5", "0x10", "12abc", "", " 5",
/// "nan" and anything outside the range are refused.
#pragma once

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include "strata/core/error.hpp"

namespace strata::cli {

/// `value` of flag `flag` as an integer in [lo, hi].
template <std::integral T>
T parse_integer(std::string_view flag, std::string_view value, T lo, T hi) {
  const auto refuse = [&](std::string_view why) -> T {
    fail(errc::invalid_argument,
         cat(flag, ": '", value, "' ", why, "; accepted: integers ", +lo, " .. ", +hi));
  };
  if (value.empty()) return refuse("is empty");
  const char* first = value.data();
  const char* last = value.data() + value.size();
  if (*first == '+') ++first;  // from_chars takes no plus sign
  if constexpr (std::is_signed_v<T>) {
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(first, last, v);
    if (ec == std::errc{} && end == last) {
      if (v < static_cast<std::int64_t>(lo) || v > static_cast<std::int64_t>(hi))
        return refuse("is out of range");
      return static_cast<T>(v);
    }
    if (ec == std::errc::result_out_of_range) return refuse("is out of range");
  } else {
    std::uint64_t v = 0;
    const auto [end, ec] = std::from_chars(first, last, v);
    if (ec == std::errc{} && end == last) {
      if (v < static_cast<std::uint64_t>(lo) || v > static_cast<std::uint64_t>(hi))
        return refuse("is out of range");
      return static_cast<T>(v);
    }
    if (ec == std::errc::result_out_of_range) return refuse("is out of range");
    if (*first == '-' && value.find_first_of("eE") == std::string_view::npos)
      return refuse("is negative");
  }
  // Scientific notation of a whole number ("1e6").
  if (value.find_first_of("eE") == std::string_view::npos ||
      value.find_first_of("xXpP") != std::string_view::npos)
    return refuse("is not an integer");
  const std::string text(value);
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(x) || x != std::floor(x))
    return refuse("is not an integer");
  if (x < static_cast<double>(lo) || x > static_cast<double>(hi)) return refuse("is out of range");
  // Exactly representable here: |x| ≤ hi and x is whole; beyond 2^53 a double may denote a
  // neighbour of what was typed, so such values must be typed as digits.
  if (std::abs(x) > 9007199254740992.0) return refuse("is too large for scientific notation");
  return static_cast<T>(x);
}

/// The accepted interval of a real flag: [lo, hi], or (lo, hi] when `lo_open`.
struct real_range {
  double lo = -std::numeric_limits<double>::max();
  double hi = std::numeric_limits<double>::max();
  bool lo_open = false;
};

/// `value` of flag `flag` as a finite real inside `range`.
inline double parse_real(std::string_view flag, std::string_view value, real_range range) {
  const auto refuse = [&](std::string_view why) -> double {
    fail(errc::invalid_argument, cat(flag, ": '", value, "' ", why, "; accepted: ",
                                     range.lo_open ? "(" : "[", range.lo, ", ", range.hi, "]"));
  };
  if (value.empty()) return refuse("is empty");
  if (value.find_first_of("xXpP") != std::string_view::npos || value.front() == ' ')
    return refuse("is not a decimal number");
  const std::string text(value);
  char* end = nullptr;
  const double x = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return refuse("is not a number");
  if (!std::isfinite(x)) return refuse("is not finite");
  if (x > range.hi || x < range.lo || (range.lo_open && x == range.lo))
    return refuse("is out of range");
  return x;
}

/// `value` of flag `flag` when it is one of `names`.
inline std::string parse_name(std::string_view flag, std::string_view value,
                              std::initializer_list<std::string_view> names) {
  std::string accepted;
  for (const auto name : names) {
    if (value == name) return std::string(value);
    accepted += cat(accepted.empty() ? "" : ", ", name);
  }
  fail(errc::invalid_argument, cat(flag, ": '", value, "' is not accepted; accepted: ", accepted));
}

/// The value following the flag at argv[i] (i advances to it), or errc::invalid_argument
/// "<prefix>flag <argv[i]> needs a value; see --help" when the flag is the last argument.
inline std::string flag_value(int argc, const char* const* argv, int& i,
                              std::string_view prefix = {}) {
  if (i + 1 >= argc)
    fail(errc::invalid_argument, cat(prefix, "flag ", argv[i], " needs a value; see --help"));
  return argv[++i];
}

/// True when this process was started by mpirun / mpiexec (Open MPI, MPICH's PMI, PMIx set
/// these in every process they start): the example programs then run one rank per process.
inline bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

}  // namespace strata::cli

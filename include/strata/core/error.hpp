/// @file error.hpp
/// strata's one exception type, its error codes and the precondition check used on user input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace strata {

/// What kind of failure an error reports; stable, so callers may branch on it.
enum class errc {
  invalid_argument,  ///< a value the caller passed is not allowed
  out_of_range,      ///< an index or key outside its valid range
  size_mismatch,     ///< two sizes that must agree do not
  timeout,           ///< a peer did not answer within the operation's timeout
  aborted,           ///< another rank failed and the world was stopped
  bad_message,       ///< a malformed, truncated or unexpected message was received
  io_error,          ///< a file could not be opened, read or written
  corrupt_data,      ///< a file or checkpoint failed validation (magic, checksum, field)
  unsupported,       ///< a feature is not available in this build or configuration
  internal,          ///< a broken invariant inside strata (a bug: please report it)
  diverged,          ///< training produced a non-finite loss, gradient or parameter
  out_of_memory,     ///< data does not fit the memory (or address space) a process may use
};

/// Human-readable name of an error code.
constexpr std::string_view to_string(errc code) noexcept {
  switch (code) {
    case errc::invalid_argument:
      return "invalid_argument";
    case errc::out_of_range:
      return "out_of_range";
    case errc::size_mismatch:
      return "size_mismatch";
    case errc::timeout:
      return "timeout";
    case errc::aborted:
      return "aborted";
    case errc::bad_message:
      return "bad_message";
    case errc::io_error:
      return "io_error";
    case errc::corrupt_data:
      return "corrupt_data";
    case errc::unsupported:
      return "unsupported";
    case errc::internal:
      return "internal";
    case errc::diverged:
      return "diverged";
    case errc::out_of_memory:
      return "out_of_memory";
  }
  return "unknown";
}

/// The exception strata throws: a `std::runtime_error` carrying an `errc`.
/// The message says what failed, where (file:line, rank, peer, tag) and what to do.
class error : public std::runtime_error {
 public:
  error(errc code, const std::string& message)
      : std::runtime_error("strata " + std::string(to_string(code)) + ": " + message),
        code_(code) {}
  [[nodiscard]] errc code() const noexcept { return code_; }

 private:
  errc code_;
};

/// Builds a message from streamable parts: `cat("rank ", r, " peer ", p)`.
template <class... Parts>
std::string cat(const Parts&... parts) {
  if constexpr (sizeof...(Parts) == 0) {
    return {};
  } else {
    std::ostringstream out;
    (out << ... << parts);
    return out.str();
  }
}

/// `value` as 16 lowercase hex digits (checksums, fingerprints, run ids in messages).
inline std::string hex16(std::uint64_t value) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string text(16, '0');
  for (std::size_t i = 16; i-- > 0; value >>= 4)
    text[i] = digits[value & 0xF];
  return text;
}

/// Throws `strata::error(code, message)`.
[[noreturn]] inline void fail(errc code, const std::string& message) {
  throw error(code, message);
}

namespace detail {
[[noreturn]] inline void expects_failed(const char* condition, const std::string& message,
                                        const char* file, int line) {
  throw error(errc::invalid_argument,
              cat(message, " [check `", condition, "` failed at ", file, ":", line, "]"));
}
}  // namespace detail

}  // namespace strata

/// Precondition on user input: throws `strata::error(errc::invalid_argument)` with the message,
/// the failed condition and the source location. The message is only built on failure.
/// A macro (not a function) so that the condition text is shown and the message stays lazy.
/// (__FILE__ / __LINE__ rather than std::source_location, which clang 14 with libstdc++ 12
/// does not provide.)
#define STRATA_EXPECTS(condition, ...)                                                   \
  do {                                                                                   \
    if (!(condition)) [[unlikely]]                                                       \
      ::strata::detail::expects_failed(#condition, ::strata::cat(__VA_ARGS__), __FILE__, \
                                       __LINE__);                                        \
  } while (false)

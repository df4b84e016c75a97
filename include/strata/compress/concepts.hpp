/// @file concepts.hpp
/// The `compressor` contract (floats → bytes → floats) and its two optional refinements:
/// `fixed_size_compressor` (the encoded size is known from the element count) and
/// `positional_compressor` (a stateful codec that tracks positions of a fixed-length buffer).
#pragma once

#include <bit>
#include <concepts>
#include <cstddef>
#include <span>

#include "strata/core/error.hpp"

namespace strata::compress {

static_assert(std::endian::native == std::endian::little,
              "strata::compress writes its wire formats in host byte order and assumes a "
              "little-endian host; a big-endian port needs byte swaps in every codec");

/// A codec that turns a span of floats into bytes and back.
///
/// Semantics every model must keep:
/// - `C::name`: a short static name for tables and logs.
/// - `c.max_encoded_bytes(n)`: an upper bound on the bytes `encode` writes for `n` floats.
///   Pure, const, thread-safe.
/// - `c.encode(in, out) -> std::size_t`: writes the encoding of `in` to the front of `out` and
///   returns the bytes written (≤ `max_encoded_bytes(in.size())`). `out` smaller than that bound
///   raises `errc::invalid_argument` before anything is written. May change the codec's state
///   (scratch space, an error-feedback residual), so it takes a non-const codec and one codec
///   object must not encode from two threads at once.
/// - `c.decode(bytes, out)`: overwrites `out` with the values `bytes` encode;
///   `c.decode_add(bytes, acc)` adds them to `acc` (the receive side of a reduce). Both are
///   const and thread-safe, take the element count from the output span, and validate the byte
///   count and contents against it first: a malformed or truncated message raises
///   `errc::bad_message`, leaves the output untouched and never reads out of bounds.
/// - Decoding is deterministic: the same bytes give bit-identical floats on every rank.
///
/// Cost: every strata codec is O(n) per call (topk adds an O(n) average selection).
template <class C>
concept compressor = requires {  // the cheap check first, so a wrong type gets a short error
  { C::name } -> std::convertible_to<const char*>;
}
&&requires(C& c, const C& cc, std::size_t n, std::span<const float> in, std::span<std::byte> out,
           std::span<const std::byte> bytes, std::span<float> values) {
  { cc.max_encoded_bytes(n) } -> std::convertible_to<std::size_t>;
  { c.encode(in, out) } -> std::same_as<std::size_t>;
  cc.decode(bytes, values);
  cc.decode_add(bytes, values);
};

/// A compressor whose `encode` always writes exactly `max_encoded_bytes(n)` bytes (it declares
/// `static constexpr bool fixed_size = true`). A receiver then knows a message's size from the
/// element count alone, so collectives can use exact-size `sendrecv` without a size header.
template <class C>
concept fixed_size_compressor = compressor<C> && requires {
  requires C::fixed_size;
};

/// A stateful compressor bound to a buffer of `length()` positions (an error-feedback
/// residual): `encode_at(offset, in, out)` encodes `in` as the values at positions
/// [offset, offset + in.size()) of that buffer. Collectives that encode chunks of a buffer call
/// `encode_at` with the chunk's offset so the state follows the positions.
template <class C>
concept positional_compressor = compressor<C> &&
    requires(C& c, const C& cc, std::size_t offset, std::span<const float> in,
             std::span<std::byte> out) {
  { cc.length() } -> std::convertible_to<std::size_t>;
  { c.encode_at(offset, in, out) } -> std::same_as<std::size_t>;
};

namespace detail {

/// Raises `errc::invalid_argument` when an encode target cannot hold the worst case.
inline void check_encode_room(const char* codec, std::size_t count, std::size_t room,
                              std::size_t needed) {
  STRATA_EXPECTS(room >= needed, codec, ": encoding ", count, " floats needs up to ", needed,
                 " bytes but the output holds ", room, "; size it with max_encoded_bytes(n)");
}

/// Raises `errc::bad_message` for a message whose size does not match the expected one.
inline void check_message_size(const char* codec, std::size_t count, std::size_t got,
                               std::size_t expected) {
  if (got != expected)
    fail(errc::bad_message,
         cat(codec, ": message of ", got, " bytes cannot hold ", count, " values (expected ",
             expected,
             " bytes); was it truncated, or encoded by another codec or for another "
             "length?"));
}

/// Encodes `in` as positions [offset, offset + in.size()) when the codec tracks positions,
/// else as a plain `encode`.
template <compressor C>
std::size_t encode_at(C& codec, std::size_t offset, std::span<const float> in,
                      std::span<std::byte> out) {
  if constexpr (positional_compressor<C>)
    return codec.encode_at(offset, in, out);
  else
    return codec.encode(in, out);
}

}  // namespace detail

}  // namespace strata::compress

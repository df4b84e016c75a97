/// @file protocol.hpp
/// Wire format of parameter-server messages: a 48-byte header (magic, version, type, codec,
/// worker, table, step, key count, dim, policy, payload bytes) and a typed payload. Every
/// decoder validates every field it uses before use: a malformed or truncated message raises
/// `strata::error(errc::bad_message)` naming the field, and never reads out of bounds.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/comm/phase.hpp"
#include "strata/core/error.hpp"
#include "strata/ps/partition.hpp"

namespace strata::ps {

static_assert(std::endian::native == std::endian::little,
              "strata::ps writes its wire format in host byte order and assumes a "
              "little-endian host");

/// Message kinds.
enum class msg_type : std::uint8_t {
  pull_request = 1,  ///< payload: key_count u64 keys (ascending, unique)
  pull_reply = 2,    ///< payload: key_count × dim values in `codec`
  push_request = 3,  ///< payload: key_count u64 keys (ascending, unique), then the gradient
                     ///< rows (key_count × dim values) in `codec`
  shutdown = 4,      ///< no payload: this worker is done with this server
  shutdown_ack = 5,  ///< no payload: every earlier request of the worker was handled
  error_reply = 6,   ///< payload: message text; `dim` = errc, `key_count` = failed msg_type
};
inline constexpr std::uint8_t msg_type_last = 6;

/// How float rows travel.
enum class wire_codec : std::uint8_t {
  fp32 = 0,        ///< raw little-endian floats
  fp16 = 1,        ///< IEEE binary16 (compress::fp16)
  compressed = 2,  ///< the bytes of the job's push compressor (size checked by its decoder)
};
inline constexpr std::uint8_t wire_codec_last = 2;

/// The fixed-size message header.
struct header {
  static constexpr std::uint32_t magic_value = 0x31535053u;  // "SPS1"
  static constexpr std::uint16_t version_value = 1;
  std::uint32_t magic = magic_value;
  std::uint16_t version = version_value;
  msg_type type = msg_type::pull_request;
  wire_codec codec = wire_codec::fp32;
  std::uint32_t worker = 0;  ///< worker index of the requester (or of the addressee)
  std::uint32_t table = 0;
  std::uint64_t step = 0;       ///< the worker's step counter of this table
  std::uint64_t key_count = 0;  ///< keys (or rows) in the payload
  std::uint32_t dim = 0;        ///< row width (error_reply: the errc)
  std::uint32_t policy = 0;     ///< consistency code of the sender
  std::uint64_t payload_bytes = 0;
};
inline constexpr std::size_t header_bytes = 48;

namespace detail {
template <class V>
void put(std::byte*& p, V v) noexcept {
  std::memcpy(p, &v, sizeof(V));
  p += sizeof(V);
}
template <class V>
V get(const std::byte*& p) noexcept {
  V v;
  std::memcpy(&v, p, sizeof(V));
  p += sizeof(V);
  return v;
}
[[noreturn]] inline void bad(const std::string& what) {
  fail(errc::bad_message, cat("ps protocol: ", what));
}
}  // namespace detail

/// Bytes per value of a row codec (fp32 4, fp16 2; 0 for `compressed`).
[[nodiscard]] constexpr std::size_t value_bytes(wire_codec c) noexcept {
  return c == wire_codec::fp32 ? 4 : c == wire_codec::fp16 ? 2 : 0;
}

/// Resizes `out` to header + `h.payload_bytes`, writes the header and returns the payload.
inline std::span<std::byte> start_message(std::vector<std::byte>& out, const header& h) {
  out.resize(header_bytes + h.payload_bytes);
  std::byte* p = out.data();
  detail::put(p, h.magic);
  detail::put(p, h.version);
  detail::put(p, static_cast<std::uint8_t>(h.type));
  detail::put(p, static_cast<std::uint8_t>(h.codec));
  detail::put(p, h.worker);
  detail::put(p, h.table);
  detail::put(p, h.step);
  detail::put(p, h.key_count);
  detail::put(p, h.dim);
  detail::put(p, h.policy);
  detail::put(p, h.payload_bytes);
  return {out.data() + header_bytes, h.payload_bytes};
}

/// Shrinks a message started with a larger payload to `payload_bytes` (after a compressor wrote
/// fewer bytes than its bound), fixing the header.
inline void finish_message(std::vector<std::byte>& out, std::uint64_t payload_bytes) {
  STRATA_EXPECTS(out.size() >= header_bytes && payload_bytes <= out.size() - header_bytes,
                 "ps::finish_message: payload of ", payload_bytes, " bytes does not fit");
  out.resize(header_bytes + payload_bytes);
  std::memcpy(out.data() + header_bytes - sizeof(std::uint64_t), &payload_bytes,
              sizeof(std::uint64_t));
}

/// Decodes and validates the header: size ≥ 48, magic, version, type, codec, and
/// payload_bytes equal to the bytes after the header. Throws `errc::bad_message`.
[[nodiscard]] inline header decode_header(std::span<const std::byte> message) {
  if (message.size() < header_bytes)
    detail::bad(cat("message of ", message.size(), " bytes is shorter than the ", header_bytes,
                    "-byte header (truncated?)"));
  const std::byte* p = message.data();
  header h;
  h.magic = detail::get<std::uint32_t>(p);
  if (h.magic != header::magic_value)
    detail::bad(cat("bad magic 0x", std::hex, h.magic, " (expected 0x", header::magic_value,
                    "); not a strata parameter-server message"));
  h.version = detail::get<std::uint16_t>(p);
  if (h.version != header::version_value)
    detail::bad(cat("version ", h.version, " but this build speaks version ", header::version_value,
                    "; are all ranks built from the same strata?"));
  const auto type = detail::get<std::uint8_t>(p);
  if (type == 0 || type > msg_type_last) detail::bad(cat("unknown message type ", int{type}));
  h.type = static_cast<msg_type>(type);
  const auto codec = detail::get<std::uint8_t>(p);
  if (codec > wire_codec_last) detail::bad(cat("unknown codec ", int{codec}));
  h.codec = static_cast<wire_codec>(codec);
  h.worker = detail::get<std::uint32_t>(p);
  h.table = detail::get<std::uint32_t>(p);
  h.step = detail::get<std::uint64_t>(p);
  h.key_count = detail::get<std::uint64_t>(p);
  h.dim = detail::get<std::uint32_t>(p);
  h.policy = detail::get<std::uint32_t>(p);
  h.payload_bytes = detail::get<std::uint64_t>(p);
  if (h.payload_bytes != message.size() - header_bytes)
    detail::bad(cat("header announces ", h.payload_bytes, " payload bytes but the message carries ",
                    message.size() - header_bytes, " (truncated or padded)"));
  return h;
}

/// The payload of a message whose header was decoded.
[[nodiscard]] inline std::span<const std::byte> payload_of(std::span<const std::byte> message) {
  return message.subspan(header_bytes);
}

/// Checks that a key list fits the payload: key_count · 8 ≤ payload, with `exact` requiring
/// equality. Overflow-safe.
inline void check_key_payload(const header& h, bool exact) {
  const std::uint64_t max_keys = h.payload_bytes / sizeof(std::uint64_t);
  if (h.key_count > max_keys || (exact && h.key_count * 8 != h.payload_bytes))
    detail::bad(cat("key count ", h.key_count, " does not match a payload of ", h.payload_bytes,
                    " bytes (", exact ? "exactly " : "at least ", "8 bytes per key)"));
}

/// Copies the `h.key_count` keys at the front of the payload into `keys` and checks they are
/// strictly ascending (every strata client sends unique sorted keys).
inline void read_keys(const header& h, std::span<const std::byte> message,
                      std::vector<std::uint64_t>& keys) {
  check_key_payload(h, false);
  keys.resize(static_cast<std::size_t>(h.key_count));
  if (!keys.empty()) std::memcpy(keys.data(), message.data() + header_bytes, keys.size() * 8);
  for (std::size_t i = 1; i < keys.size(); ++i)
    if (keys[i] <= keys[i - 1])
      detail::bad(cat("keys are not strictly ascending at position ", i, " (", keys[i - 1],
                      " then ", keys[i], ")"));
}

/// Number of row values a message carries (key_count · dim), overflow-checked against a cap of
/// 2^40 values.
[[nodiscard]] inline std::size_t row_values(const header& h) {
  if (h.dim == 0 || h.dim > (1u << 20)) detail::bad(cat("dim ", h.dim, " outside [1, 2^20]"));
  if (h.key_count > (std::uint64_t{1} << 40) / h.dim)
    detail::bad(cat("key count ", h.key_count, " × dim ", h.dim, " is too large"));
  return static_cast<std::size_t>(h.key_count * h.dim);
}

/// Builds an error reply carrying `code` and `text` for a failed request of type `failed`.
inline void encode_error(std::vector<std::byte>& out, std::uint32_t worker, msg_type failed,
                         std::uint32_t table, std::uint64_t step, errc code,
                         std::string_view text) {
  header h;
  h.type = msg_type::error_reply;
  h.codec = static_cast<wire_codec>(0);
  h.worker = worker;
  h.table = table;
  h.step = step;
  h.key_count = static_cast<std::uint64_t>(failed);
  h.dim = static_cast<std::uint32_t>(code);
  h.payload_bytes = text.size();
  auto payload = start_message(out, h);
  if (!text.empty()) std::memcpy(payload.data(), text.data(), text.size());
}

/// Decoded error reply.
struct error_info {
  errc code = errc::internal;
  msg_type failed = msg_type::pull_request;
  std::string text;
};

/// The last error code an error reply may carry: every strata::error a server raises travels
/// with its code (the static_assert fails when core/error.hpp gains a code after it).
inline constexpr errc errc_last = errc::out_of_memory;
static_assert(to_string(static_cast<errc>(static_cast<int>(errc_last) + 1)) == "unknown",
              "strata::errc has a code after ps::errc_last: move errc_last to it, so error "
              "replies carrying the new code decode");

/// Decodes an error reply whose header `h` was decoded from `message`; validates the code and
/// the failed request type.
[[nodiscard]] inline error_info decode_error(const header& h, std::span<const std::byte> message) {
  error_info info;
  if (h.key_count == 0 || h.key_count > msg_type_last)
    detail::bad(cat("error reply names unknown request type ", h.key_count));
  info.failed = static_cast<msg_type>(h.key_count);
  if (h.dim > static_cast<std::uint32_t>(errc_last))
    detail::bad(cat("error reply carries unknown error code ", h.dim));
  info.code = static_cast<errc>(h.dim);
  const auto text = payload_of(message);
  info.text.assign(reinterpret_cast<const char*>(text.data()), text.size());
  return info;
}

/// A decoded, validated request.
struct request {
  header h;
  std::vector<std::uint64_t> keys;    ///< strictly ascending, inside the table
  std::span<const std::byte> values;  ///< push: the gradient rows' bytes (in `h.codec`)
};

/// Decodes a request a server received from worker `worker` and validates every field against
/// the shard map and the server's consistency `policy`: header, type (pull, push or shutdown),
/// worker, table, dim, policy, key count against the payload, keys strictly ascending and
/// inside a fixed table, pull codec (fp32/fp16), push gradient bytes (fp32: exactly
/// key_count · dim · 4; compressed: left to the codec's decoder, which validates them).
/// Throws `errc::bad_message` naming the field. Cost: O(key_count).
[[nodiscard]] inline request decode_request(std::span<const std::byte> message,
                                            const shard_map& map, std::uint32_t policy,
                                            int worker) {
  request r;
  r.h = decode_header(message);
  const header& h = r.h;
  if (h.worker != static_cast<std::uint32_t>(worker))
    detail::bad(
        cat("header names worker ", h.worker, " but the message came from worker ", worker));
  if (h.type == msg_type::shutdown) {
    if (h.payload_bytes != 0) detail::bad("shutdown carries a payload");
    return r;
  }
  if (h.type != msg_type::pull_request && h.type != msg_type::push_request)
    detail::bad(cat("a server does not accept message type ", static_cast<int>(h.type)));
  if (h.table >= map.table_count())
    detail::bad(cat("table ", h.table, " outside the ", map.table_count(), " tables"));
  const auto& spec = map.spec(h.table);
  if (h.dim != spec.dim)
    detail::bad(
        cat("dim ", h.dim, " but table ", h.table, " '", spec.name, "' has dim ", spec.dim));
  if (h.policy != policy)
    detail::bad(cat("the worker uses consistency code ", h.policy, " but this server runs code ",
                    policy, "; use one consistency policy for the whole job"));
  if (h.type == msg_type::pull_request) {
    if (h.codec != wire_codec::fp32 && h.codec != wire_codec::fp16)
      detail::bad(cat("pull replies can be fp32 or fp16, not codec ", static_cast<int>(h.codec)));
    check_key_payload(h, true);
  }
  read_keys(h, message, r.keys);
  if (spec.rows != 0 && !r.keys.empty() && r.keys.back() >= spec.rows)
    detail::bad(cat("key ", r.keys.back(), " of table ", h.table, " '", spec.name,
                    "' is outside its rows [0, ", spec.rows, ")"));
  if (h.type == msg_type::push_request) {
    const std::size_t values = row_values(h);
    r.values = payload_of(message).subspan(r.keys.size() * 8);
    if (h.codec == wire_codec::fp16) detail::bad("pushes are fp32 or compressed, not fp16");
    if (h.codec == wire_codec::fp32 && r.values.size() != values * 4)
      detail::bad(cat("push of ", r.keys.size(), " rows × ", h.dim, " needs ", values * 4,
                      " gradient bytes, got ", r.values.size()));
  }
  return r;
}

/// The phase of a message (a `comm::phase_classifier`): a PS request or reply by its type —
/// pull request or reply `pull`, push request `push`, shutdown and its answer `shutdown`, an
/// error reply `pull` — any other message by its tag (`comm::phase_of_tag`). Reads one byte
/// of the header; a message too short for it keeps its tag's phase.
[[nodiscard]] inline comm::phase message_phase(comm::tag_t tag,
                                               std::span<const std::byte> bytes) noexcept {
  if ((tag != comm::tags::ps_request && tag != comm::tags::ps_reply) || bytes.size() < 7)
    return comm::phase_of_tag(tag);
  switch (static_cast<msg_type>(std::to_integer<std::uint8_t>(bytes[6]))) {
    case msg_type::push_request:
      return comm::phase::push;
    case msg_type::shutdown:
    case msg_type::shutdown_ack:
      return comm::phase::shutdown;
    case msg_type::pull_request:
    case msg_type::pull_reply:
    case msg_type::error_reply:
      return comm::phase::pull;
  }
  return comm::phase_of_tag(tag);
}

}  // namespace strata::ps

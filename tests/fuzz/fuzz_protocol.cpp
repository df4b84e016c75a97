// libFuzzer target: the parameter-server wire protocol (strata/ps/protocol.hpp) and every
// place a message kind is decoded.
//
// Input: one settings byte (bits 0-1 pick the side), then that side's settings and bytes.
//   0, 3  server side: a second byte shapes the shard map, policy and push codec, a third
//         names the sending worker and shifts the tables' rows; the rest is one message for
//         ps::decode_request (pull and push requests, shutdown). An accepted push's gradient bytes
//         then go through the server's codec decoder, as ps::server does (fp32 copy, or fp16 /
//         int8_block / topk).
//   1     worker side: the real ps::client over a scripted transport whose replies come from
//         the input (each a u16 length, then its bytes; the transport times out once they run
//         out): pull / two-table pull / push then pull, then shutdown. This decodes pull
//         replies (fp32 and fp16), shutdown acks and error replies exactly as a worker does.
//   2     the rest is one message for decode_header and, for an error reply, decode_error;
//         and an error reply built by encode_error with an error code from the input must
//         decode to the same code, request type and text.
// Oracles: an accepted message re-encodes (start_message) to the same 48 header bytes; an
// accepted request has keys strictly ascending and inside the table, and an fp32 push exactly
// key_count x dim x 4 gradient bytes; pulled rows of equal keys are equal. The decoders may
// only refuse with bad_message (the worker side also passes on the servers' own error codes
// and the transport's timeout).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/identity.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/compress/topk.hpp"
#include "strata/core/matrix.hpp"
#include "strata/ps/client.hpp"
#include "strata/ps/consistency.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/protocol.hpp"

#include "support.hpp"

namespace {

using namespace strata;
using namespace strata::ps;

/// The 48 header bytes start_message writes for `h` equal the message's own.
void check_header_round_trip(const header& h, std::span<const std::byte> message) {
  header copy = h;
  copy.payload_bytes = 0;  // only the header is compared; the length is patched below
  std::vector<std::byte> out;
  start_message(out, copy);
  std::memcpy(out.data() + header_bytes - 8, &h.payload_bytes, 8);
  strata_fuzz::require(std::memcmp(out.data(), message.data(), header_bytes) == 0,
                       "ps protocol: an accepted header does not re-encode to its bytes");
}

// ---- server side ---------------------------------------------------------------------------

template <class Codec>
void decode_push_values(const Codec& codec, const request& r) {
  std::vector<float> grads(r.keys.size() * r.h.dim);
  if constexpr (std::is_same_v<Codec, compress::identity>) {
    if (r.h.codec != wire_codec::fp32) return;  // the server refuses it (bad_message)
    strata_fuzz::require(r.values.size() == grads.size() * 4,
                         "decode_request: fp32 push of the wrong size accepted");
    if (!grads.empty()) std::memcpy(grads.data(), r.values.data(), grads.size() * 4);
  } else {
    if (r.h.codec != wire_codec::compressed) return;  // the server refuses it (bad_message)
    codec.decode(r.values, std::span<float>(grads));
  }
}

void server_side(strata_fuzz::input& in) {
  // shape: bits 0-1 tables (1 + value % 3), bit 2 two servers, bit 3 range partition, bits
  // 4-5 policy (sync, async, bounded<2>, bounded<5>), bits 6-7 the server's push codec
  // (identity, fp16, int8_block<4>, topk(0.5)); who: bits 0-1 the sending worker, bits 2-7
  // shift the tables' rows. Table t has dim {1, 3, 8}[t] and rows {0 (unbounded), 10, 1000}.
  const unsigned shape = in.u8(), who = in.u8();
  const int worker = static_cast<int>(who & 3u);
  std::vector<table_spec> tables;
  const std::size_t count = 1 + (shape & 3u) % 3;
  constexpr std::size_t dims[] = {1, 3, 8};
  constexpr std::uint64_t rows[] = {0, 10, 1000};
  for (std::size_t t = 0; t < count; ++t)
    tables.push_back({"t" + std::to_string(t), rows[(t + (who >> 2)) % 3], dims[t]});
  const shard_map map(layout::dedicated(4, 1 + ((shape >> 2) & 1u)), tables,
                      (shape & 8u) != 0 ? partition_kind::range : partition_kind::hash);
  constexpr std::uint32_t policies[] = {sync::code, async::code, bounded<2>::code,
                                        bounded<5>::code};
  const std::uint32_t policy = policies[(shape >> 4) & 3u];
  const auto bytes = std::as_bytes(in.rest());
  const request r = decode_request(bytes, map, policy, worker);
  check_header_round_trip(r.h, bytes);
  strata_fuzz::require(r.h.worker == static_cast<std::uint32_t>(worker),
                       "decode_request: accepted another worker");
  // A shutdown carries no data: decode_request checks only its worker and its empty payload
  // (its table, dim, policy and key count are unused, and not checked; docs/fuzzing.md).
  if (r.h.type == msg_type::shutdown) {
    strata_fuzz::require(r.h.payload_bytes == 0, "decode_request: a shutdown with a payload");
    return;
  }
  strata_fuzz::require(r.h.policy == policy, "decode_request: accepted another policy");
  strata_fuzz::require(r.h.type == msg_type::pull_request || r.h.type == msg_type::push_request,
                       "decode_request: accepted a reply type");
  const table_spec& spec = map.spec(r.h.table);
  strata_fuzz::require(r.h.dim == spec.dim && r.keys.size() == r.h.key_count,
                       "decode_request: dim or key count disagree");
  for (std::size_t i = 0; i < r.keys.size(); ++i) {
    strata_fuzz::require(i == 0 || r.keys[i - 1] < r.keys[i],
                         "decode_request: keys not strictly ascending");
    strata_fuzz::require(spec.rows == 0 || r.keys[i] < spec.rows,
                         "decode_request: a key outside the table");
  }
  if (r.h.type == msg_type::pull_request) {
    strata_fuzz::require(r.h.payload_bytes == r.h.key_count * 8 &&
                             (r.h.codec == wire_codec::fp32 || r.h.codec == wire_codec::fp16),
                         "decode_request: a pull with extra bytes or a bad codec accepted");
    return;
  }
  switch (shape >> 6) {
    case 0:
      return decode_push_values(compress::identity{}, r);
    case 1:
      return decode_push_values(compress::fp16{}, r);
    case 2:
      return decode_push_values(compress::int8_block<4>{}, r);
    default:
      return decode_push_values(compress::topk(0.5), r);
  }
}

// ---- worker side ---------------------------------------------------------------------------

/// A transport whose every receive returns the next scripted message (u16 length + bytes) and
/// whose sends go nowhere; once the script is spent a receive times out, as a real transport
/// does when the peer never answers.
class scripted_transport {
 public:
  scripted_transport(int rank, int size, strata_fuzz::input& script)
      : rank_(rank), size_(size), script_(&script) {}
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] double timeout_seconds() const { return 1.0; }
  void send(int, comm::tag_t, std::span<const std::byte>) {}
  void recv(int peer, comm::tag_t tag, std::span<std::byte> bytes) {
    const auto m = recv_message(peer, tag);
    if (m.size() != bytes.size()) fail(errc::size_mismatch, "scripted_transport: size");
    if (!m.empty()) std::memcpy(bytes.data(), m.data(), m.size());
  }
  std::vector<std::byte> recv_message(int peer, comm::tag_t tag) {
    if (++received_ > 64 || script_->rest_size() == 0)
      fail(errc::timeout, cat("scripted_transport: rank ", peer, " never answered tag ", tag));
    const auto bytes = std::as_bytes(script_->take(script_->u16()));
    return {bytes.begin(), bytes.end()};
  }
  comm::message recv_any(comm::tag_t tag) { return {0, tag, recv_message(0, tag)}; }
  void sendrecv(int, std::span<const std::byte>, int from, std::span<std::byte> in,
                comm::tag_t tag) {
    recv(from, tag, in);
  }
  [[nodiscard]] std::uint64_t bytes_sent_to(int) const { return 0; }
  [[nodiscard]] std::uint64_t bytes_received_from(int) const { return 0; }

 private:
  int rank_, size_;
  strata_fuzz::input* script_;
  int received_ = 0;
};
static_assert(comm::transport<scripted_transport>);

/// Rows of equal keys were filled from the same reply row: bitwise equal.
void check_equal_keys(std::span<const std::uint64_t> keys, const matrix<float>& out) {
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (std::size_t j = 0; j < i; ++j)
      if (keys[i] == keys[j])
        strata_fuzz::require(
            std::memcmp(out.row(i).data(), out.row(j).data(), out.cols() * sizeof(float)) == 0,
            "ps::client: equal keys pulled different rows");
}

void worker_side(strata_fuzz::input& in) {
  const unsigned shape = in.u8();
  const int servers = 1 + static_cast<int>(shape & 1u);
  constexpr std::size_t dims[] = {1, 2, 4, 3};
  const std::size_t dim = dims[(shape >> 2) & 3u];
  const std::uint64_t rows = (shape & 16u) != 0 ? 100 : 0;
  const shard_map map(layout::dedicated(1, servers), {{"a", rows, dim}, {"b", rows, 2}},
                      (shape & 32u) != 0 ? partition_kind::range : partition_kind::hash);
  scripted_transport t(0, 1 + servers, in);
  client_options options;
  options.fp16_pulls = (shape & 2u) != 0;
  client<async, scripted_transport> c(t, map, options);
  const std::vector<std::uint64_t> keys = {7, 3, 7, 42, 3, 99};
  matrix<float> a(keys.size(), dim), b(keys.size(), 2);
  switch (shape >> 6) {
    case 0:
      c.pull(0, keys, a);
      check_equal_keys(keys, a);
      break;
    case 1:
      break;
    case 2: {
      const table_pull both[] = {{0, keys, a}, {1, keys, b}};
      c.pull_tables(both);
      check_equal_keys(keys, a);
      check_equal_keys(keys, b);
      break;
    }
    default: {
      matrix<float> grads(keys.size(), dim);
      c.push(0, keys, grads);
      c.pull(0, keys, a);
      check_equal_keys(keys, a);
      break;
    }
  }
  c.shutdown();
}

// ---- headers and error replies -------------------------------------------------------------

void message_side(strata_fuzz::input& in) {
  const unsigned code = in.u8() % 16;
  const unsigned failed = 1 + in.u8() % msg_type_last;
  const auto bytes = std::as_bytes(in.rest());
  // An error reply of every code strata has decodes to that code (the server sends the code
  // of whatever strata::error a request raised).
  if (to_string(static_cast<errc>(code)) != "unknown") {
    const std::string_view text(reinterpret_cast<const char*>(bytes.data()),
                                std::min<std::size_t>(bytes.size(), 64));
    std::vector<std::byte> reply;
    encode_error(reply, 1, static_cast<msg_type>(failed), 2, 3, static_cast<errc>(code), text);
    try {
      const error_info info = decode_error(decode_header(reply), reply);
      strata_fuzz::require(info.code == static_cast<errc>(code) &&
                               info.failed == static_cast<msg_type>(failed) && info.text == text,
                           "encode_error/decode_error: the reply does not round-trip");
    } catch (const error& e) {
      strata_fuzz::finding(cat("encode_error/decode_error: an error reply with code ",
                               to_string(static_cast<errc>(code)),
                               " is refused by its decoder: ", e.what()));
    }
  }
  const header h = decode_header(bytes);
  check_header_round_trip(h, bytes);
  if (h.type == msg_type::error_reply) {
    const error_info info = decode_error(h, bytes);
    strata_fuzz::require(info.text.size() == h.payload_bytes && to_string(info.code) != "unknown",
                         "decode_error: text or code wrong");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  strata_fuzz::input in(data, size);
  const unsigned side = in.u8() & 3u;
  try {
    if (side == 1) {
      worker_side(in);
    } else if (side == 2) {
      message_side(in);
    } else {
      server_side(in);
    }
    strata_fuzz::note("accepted");
  } catch (const error& e) {
    // The worker side raises the servers' error codes as they were sent, and the transport's
    // timeout when a reply never comes: every strata::error is an expected outcome there.
    if (side == 1)
      strata_fuzz::expect_code(e, {});
    else
      strata_fuzz::expect_code(e, {errc::bad_message});
  }
  return 0;
}

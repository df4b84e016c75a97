/// @file concepts.hpp
/// The `transport` contract every communication backend models (thread_world, MPI, NCCL).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace strata::comm {

/// A message tag. Tags at or above `reserved_tag_base` belong to strata's own protocols
/// (collectives, parameter server); user code uses tags below it.
using tag_t = std::uint32_t;
inline constexpr tag_t reserved_tag_base = 0x8000'0000u;

/// Tags used by strata's collectives, parameter server and trainer; `comm::phase_of_tag`
/// (phase.hpp) names the phase of each.
namespace tags {
inline constexpr tag_t allreduce = reserved_tag_base + 1;
inline constexpr tag_t allreduce_check = reserved_tag_base + 2;
inline constexpr tag_t allgather = reserved_tag_base + 3;
inline constexpr tag_t broadcast = reserved_tag_base + 4;
inline constexpr tag_t barrier = reserved_tag_base + 5;
inline constexpr tag_t compressed_allreduce = reserved_tag_base + 6;
inline constexpr tag_t checkpoint = reserved_tag_base + 7;  ///< a checkpoint's barriers
inline constexpr tag_t ps_request = reserved_tag_base + 0x100;
inline constexpr tag_t ps_reply = reserved_tag_base + 0x101;
inline constexpr tag_t ordered_allreduce = reserved_tag_base + 0x200;  ///< trainer: rank order
inline constexpr tag_t gatherv = reserved_tag_base + 0x201;            ///< trainer: row gradients
inline constexpr tag_t report = reserved_tag_base + 0x300;  ///< trainer: end-of-run checksums
inline constexpr tag_t user_max = reserved_tag_base - 1;
}  // namespace tags

/// A received message of any size, with its source rank.
struct message {
  int source = -1;
  tag_t tag = 0;
  std::vector<std::byte> bytes;
};

/// One rank's endpoint of a communicator of `size()` ranks.
///
/// Semantics every model must keep:
/// - `send(peer, tag, bytes)` returns once `bytes` may be reused (it may buffer).
/// - `recv(peer, tag, bytes)` blocks until a message from `peer` with `tag` arrives and fills
///   `bytes`; a message of another size raises `errc::size_mismatch`.
/// - `recv_message(peer, tag)` / `recv_any(tag)` receive a message of any size (from `peer` /
///   from any rank).
/// - `sendrecv(to, out, from, in, tag)` sends and receives concurrently (no deadlock in a ring).
/// - Messages between one (source, destination, tag) triple arrive in the order sent.
/// - Every blocking call ends within `timeout_seconds()`: when the peer never answers it raises
///   `errc::timeout` naming rank, peer and tag; when another rank failed, `errc::aborted`.
/// - `bytes_sent_to(peer)` / `bytes_received_from(peer)` count payload bytes on each link.
/// - One endpoint may be used from several threads at once (e.g. a co-located PS server thread
///   beside the worker), as long as two threads do not wait for the same (peer, tag).
template <class T>
concept transport = requires(T& t, const T& ct, int peer, tag_t tag, std::span<const std::byte> out,
                             std::span<std::byte> in) {
  { ct.rank() } -> std::convertible_to<int>;
  { ct.size() } -> std::convertible_to<int>;
  t.send(peer, tag, out);
  t.recv(peer, tag, in);
  { t.recv_message(peer, tag) } -> std::same_as<std::vector<std::byte>>;
  { t.recv_any(tag) } -> std::same_as<message>;
  t.sendrecv(peer, out, peer, in, tag);
  { ct.bytes_sent_to(peer) } -> std::convertible_to<std::uint64_t>;
  { ct.bytes_received_from(peer) } -> std::convertible_to<std::uint64_t>;
  { ct.timeout_seconds() } -> std::convertible_to<double>;
};

/// An optional refinement of `transport`: `sendrecv_consume(to, out, from, in_bytes, tag, fn)`
/// behaves like `sendrecv` but calls `fn(std::span<const std::byte>)` on the incoming message
/// where it lies (e.g. in the peer's buffer) instead of copying it into a buffer of ours; the
/// span is valid only during the call. Collectives use it, when present, to reduce straight
/// from the peer's memory (one pass instead of copy-then-add); every other transport gets the
/// portable copy-then-add path. A message of another size raises `errc::size_mismatch`.
template <class T>
concept consuming_transport = transport<T> &&
    requires(T& t, int peer, tag_t tag, std::span<const std::byte> out, std::size_t in_bytes,
             void (*fn)(std::span<const std::byte>)) {
  t.sendrecv_consume(peer, out, peer, in_bytes, tag, fn);
};

/// Total payload bytes this rank sent to all peers.
template <transport T>
std::uint64_t total_bytes_sent(const T& t) {
  std::uint64_t sum = 0;
  for (int peer = 0; peer < t.size(); ++peer)
    sum += t.bytes_sent_to(peer);
  return sum;
}

/// Total payload bytes this rank received from all peers.
template <transport T>
std::uint64_t total_bytes_received(const T& t) {
  std::uint64_t sum = 0;
  for (int peer = 0; peer < t.size(); ++peer)
    sum += t.bytes_received_from(peer);
  return sum;
}

/// Sends `bytes`, moving the vector into the message where T can take it (`send_owned`, e.g.
/// `thread_transport`: `bytes` may be left empty), else with a copying `send` that leaves it.
template <transport T>
void send_moving(T& t, int peer, tag_t tag, std::vector<std::byte>& bytes) {
  if constexpr (requires { t.send_owned(peer, tag, std::move(bytes)); })
    t.send_owned(peer, tag, std::move(bytes));
  else
    t.send(peer, tag, bytes);
}
/// A buffer of capacity ≥ `bytes` that a receiver handed back (`take_buffer`, e.g.
/// `thread_transport`'s pool) to build the next message in; empty where T keeps none.
template <transport T>
[[nodiscard]] std::vector<std::byte> take_recycled(T& t, std::size_t bytes) {
  if constexpr (requires { t.take_buffer(bytes); })
    return t.take_buffer(bytes);
  else
    return {};
}
/// Hands a received message's buffer back for later sends where T recycles them (`recycle`);
/// else frees it.
template <transport T>
void recycle(T& t, std::vector<std::byte>&& bytes) {
  if constexpr (requires { t.recycle(std::move(bytes)); })
    if (!bytes.empty()) t.recycle(std::move(bytes));
}

}  // namespace strata::comm

/// @file exchange.hpp
/// Exchanges the trainer needs beyond the plain ring: an allreduce whose sums are taken in
/// rank order (so every strategy adds worker contributions in the same order as a parameter
/// server does — bitwise-equal training across strategies), and an all-gather of
/// variable-length byte blobs (sparse gradients).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/core/buffer.hpp"

namespace strata::train::detail {

inline constexpr comm::tag_t ordered_tag = comm::tags::ordered_allreduce;
inline constexpr comm::tag_t gatherv_tag = comm::tags::gatherv;

/// Sums `data` over all ranks, each element as ((v0 + v1) + v2) + … in rank order.
/// Reduce-scatter straight to each segment's owner, then ring all-gather: every rank sends
/// 2(N−1)/N of the bytes, like the ring, but the summation order does not depend on N's ring
/// position. Blocking.
template <comm::transport T, class V>
requires std::is_same_v<V, float> || std::is_same_v<V, double>
void ordered_allreduce(T& t, std::span<V> data) {
  const int n = t.size();
  comm::detail::check_same_count(t, data.size(), "ordered allreduce");
  if (n == 1) return;
  const int rank = t.rank();
  const auto mine =
      comm::detail::split(data.size(), static_cast<std::size_t>(n), static_cast<std::size_t>(rank));
  // Send every other rank its segment of my values, starting with the next rank: each rank
  // starts on a different peer, so no rank's interface receives from everyone at once.
  for (int i = 1; i < n; ++i) {
    const int peer = (rank + i) % n;
    const auto seg = comm::detail::split(data.size(), static_cast<std::size_t>(n),
                                         static_cast<std::size_t>(peer));
    t.send(peer, ordered_tag, std::as_bytes(data.subspan(seg.begin, seg.size())));
  }
  // Sum my segment in rank order.
  aligned_buffer<V> sum(mine.size()), incoming(mine.size());
  for (int peer = 0; peer < n; ++peer) {
    std::span<const V> part;
    if (peer == rank) {
      part = data.subspan(mine.begin, mine.size());
    } else {
      t.recv(peer, ordered_tag, std::as_writable_bytes(incoming.span()));
      part = incoming.span();
    }
    if (peer == 0)
      std::copy(part.begin(), part.end(), sum.begin());
    else
      comm::detail::add_into(sum.span(), part);
  }
  std::copy(sum.begin(), sum.end(), data.begin() + static_cast<std::ptrdiff_t>(mine.begin));
  // All-gather the finished segments around the ring.
  const int right = (rank + 1) % n, left = (rank + n - 1) % n;
  for (int step = 0; step < n - 1; ++step) {
    const auto send_seg = comm::detail::split(data.size(), static_cast<std::size_t>(n),
                                              comm::detail::wrap(rank - step, n));
    const auto recv_seg = comm::detail::split(data.size(), static_cast<std::size_t>(n),
                                              comm::detail::wrap(rank - step - 1, n));
    t.sendrecv(right, std::as_bytes(data.subspan(send_seg.begin, send_seg.size())), left,
               std::as_writable_bytes(data.subspan(recv_seg.begin, recv_seg.size())), ordered_tag);
  }
}

/// Every rank's blob, in rank order (blobs may differ in length). Each rank sends its blob to
/// every other rank directly: (N−1)·|blob| bytes out.
template <comm::transport T>
std::vector<std::vector<std::byte>> allgatherv(T& t, std::span<const std::byte> mine) {
  const int n = t.size();
  std::vector<std::vector<std::byte>> all(static_cast<std::size_t>(n));
  for (int i = 1; i < n; ++i)  // staggered, as in ordered_allreduce
    t.send((t.rank() + i) % n, gatherv_tag, mine);
  for (int peer = 0; peer < n; ++peer) {
    if (peer == t.rank())
      all[static_cast<std::size_t>(peer)].assign(mine.begin(), mine.end());
    else
      all[static_cast<std::size_t>(peer)] = t.recv_message(peer, gatherv_tag);
  }
  return all;
}

}  // namespace strata::train::detail

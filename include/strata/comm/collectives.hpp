/// @file collectives.hpp
/// Collectives over any `transport`: ring allreduce (chunked reduce-scatter + all-gather),
/// all-gather, broadcast and barrier.
///
/// Ring allreduce of P bytes over N ranks: every rank sends and receives 2(N−1)/N·P bytes,
/// whatever N (no hot spot), in 2(N−1) steps. Sums are taken in a fixed order per element,
/// so the result is deterministic for a given N.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

/// How values from all ranks are combined.
enum class reduce_op { sum, mean };

/// Value types the collectives reduce.
template <class T>
concept reducible = std::same_as<T, float> || std::same_as<T, double> ||
    std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t>;

namespace detail {

/// Elements [begin, end) of segment `index` when `count` elements are split into `parts`
/// nearly equal segments (the first `count % parts` segments get one more).
struct segment {
  std::size_t begin = 0;
  std::size_t end = 0;
  [[nodiscard]] std::size_t size() const noexcept { return end - begin; }
};
inline segment split(std::size_t count, std::size_t parts, std::size_t index) noexcept {
  const std::size_t base = count / parts, extra = count % parts;
  const std::size_t begin = index * base + std::min(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

inline std::size_t wrap(long long index, int size) noexcept {
  const long long n = size;
  return static_cast<std::size_t>(((index % n) + n) % n);
}

/// Checks that the left neighbour passed the same element count (a mismatch anywhere in the
/// ring shows up at some neighbour pair); raises `errc::size_mismatch` instead of a hang.
template <transport T>
void check_same_count(T& t, std::uint64_t count, const char* what) {
  if (t.size() == 1) return;
  const int right = static_cast<int>(wrap(t.rank() + 1, t.size()));
  const int left = static_cast<int>(wrap(t.rank() - 1, t.size()));
  std::uint64_t theirs = 0;
  t.sendrecv(right, std::as_bytes(std::span(&count, 1)), left,
             std::as_writable_bytes(std::span(&theirs, 1)), tags::allreduce_check);
  if (theirs != count)
    fail(errc::size_mismatch,
         cat("rank ", t.rank(), ": ", what, " of ", count, " elements, but rank ", left, " passed ",
             theirs, "; every rank must pass the same length"));
}

template <class V>
void add_into(std::span<V> accumulator, std::span<const V> values) noexcept {
  V* __restrict a = accumulator.data();
  const V* __restrict b = values.data();
  const std::size_t n = accumulator.size();
  for (std::size_t i = 0; i < n; ++i)
    a[i] += b[i];
}

/// One chunk of a reduce-scatter step: sends `out` to `to` and adds the same-length chunk that
/// `from` sends into `accumulator`. A `consuming_transport` lets us add straight from the
/// sender's memory; any other transport receives into `scratch` first.
template <transport T, class V>
void sendrecv_add(T& t, int to, std::span<const V> out, int from, std::span<V> accumulator,
                  aligned_buffer<V>& scratch, tag_t tag) {
  if constexpr (consuming_transport<T>) {
    t.sendrecv_consume(to, std::as_bytes(out), from, accumulator.size_bytes(), tag,
                       [&](std::span<const std::byte> incoming) {
                         const auto* p = incoming.data();
                         if (reinterpret_cast<std::uintptr_t>(p) % alignof(V) == 0) {
                           add_into(accumulator, std::span<const V>(reinterpret_cast<const V*>(p),
                                                                    accumulator.size()));
                         } else {  // an unaligned eager buffer: read element by element
                           for (std::size_t i = 0; i < accumulator.size(); ++i) {
                             V value;
                             std::memcpy(&value, p + i * sizeof(V), sizeof(V));
                             accumulator[i] += value;
                           }
                         }
                       });
  } else {
    if (scratch.size() < accumulator.size()) scratch = aligned_buffer<V>(accumulator.size());
    const auto incoming = scratch.span().first(accumulator.size());
    t.sendrecv(to, std::as_bytes(out), from, std::as_writable_bytes(incoming), tag);
    add_into(accumulator, std::span<const V>(incoming));
  }
}

template <class V>
void divide(std::span<V> values, int count) noexcept {
  if constexpr (std::is_floating_point_v<V>) {
    const V scale = V(1) / static_cast<V>(count);
    for (V& v : values)
      v *= scale;
  } else {
    for (V& v : values)
      v /= static_cast<V>(count);
  }
}

}  // namespace detail

/// Ring allreduce policy: `ring_allreduce{}(t, data)` sums (or averages) `data` over all ranks
/// in place. Segments move in chunks of at most `chunk_bytes`, processed column by column (see
/// the body) so the data stays in cache between reduction and gather. Each rank sends
/// 2(N−1)/N·|data| bytes in 2(N−1)·ceil(|data| / (N·chunk)) messages. On a
/// `consuming_transport` (thread_world) values are added straight from the peer's buffer; on
/// others they pass through a chunk-sized scratch buffer. Blocking; one thread per rank.
struct ring_allreduce {
  static constexpr const char* name = "ring_allreduce";
  std::size_t chunk_bytes = std::size_t{1} << 20;

  template <transport T, reducible V>
  void operator()(T& t, std::span<V> data, reduce_op op = reduce_op::sum) const {
    STRATA_EXPECTS(chunk_bytes >= sizeof(V), "ring_allreduce: chunk_bytes must hold one value");
    const int n = t.size();
    detail::check_same_count(t, data.size(), "allreduce");
    if (n == 1) return;
    const int rank = t.rank();
    const int right = static_cast<int>(detail::wrap(rank + 1, n));
    const int left = static_cast<int>(detail::wrap(rank - 1, n));
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes / sizeof(V));
    aligned_buffer<V> scratch;  // only for transports without sendrecv_consume
    const auto seg = [&](long long i) {
      return detail::split(data.size(), static_cast<std::size_t>(n), detail::wrap(i, n));
    };
    // The ring runs column by column: column c is chunk c of every segment, and each column is
    // a complete ring allreduce (reduce-scatter, then all-gather) of its own. A column's n
    // chunks stay in cache between its reduction and its gather, so each value crosses the
    // memory bus about as often as in one memcpy. Segments differ in length by at most one
    // element, so every rank runs the same number of exchanges and the k-th send always meets
    // the k-th receive (a short segment sends empty chunks).
    const std::size_t longest =
        (data.size() + static_cast<std::size_t>(n) - 1) / static_cast<std::size_t>(n);
    for (std::size_t offset = 0; offset < longest; offset += chunk) {
      const auto piece = [&](long long i) {
        const auto s = seg(i);
        const std::size_t begin = std::min(offset, s.size());
        return data.subspan(s.begin + begin, std::min(offset + chunk, s.size()) - begin);
      };
      // Reduce-scatter: after n-1 steps rank r holds the full sum of column piece r+1.
      for (int step = 0; step < n - 1; ++step)
        detail::sendrecv_add(t, right, std::span<const V>(piece(rank - step)), left,
                             piece(rank - step - 1), scratch, tags::allreduce);
      if (op == reduce_op::mean) detail::divide(piece(rank + 1), n);
      // All-gather: pass the finished pieces around the ring.
      for (int step = 0; step < n - 1; ++step)
        t.sendrecv(right, std::as_bytes(piece(rank + 1 - step)), left,
                   std::as_writable_bytes(piece(rank - step)), tags::allreduce);
    }
  }
};

/// Sums (or averages) `data` over all ranks in place with the ring algorithm.
template <transport T, reducible V>
void allreduce(T& t, std::span<V> data, reduce_op op = reduce_op::sum,
               ring_allreduce algorithm = {}) {
  algorithm(t, data, op);
}

/// Gathers every rank's `mine` (same length everywhere) into `all` in rank order
/// (`all.size() == mine.size() * size()`), around the ring: each rank sends (N−1)·|mine|.
template <transport T, class V>
requires std::is_trivially_copyable_v<V>
void allgather(T& t, std::span<const V> mine, std::span<V> all) {
  const int n = t.size();
  STRATA_EXPECTS(all.size() == mine.size() * static_cast<std::size_t>(n), "allgather: output has ",
                 all.size(), " elements, needs ", mine.size(), " x ", n, " ranks");
  detail::check_same_count(t, mine.size(), "allgather");
  const std::size_t m = mine.size();
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(m * t.rank()));
  if (n == 1) return;
  const int right = static_cast<int>(detail::wrap(t.rank() + 1, n));
  const int left = static_cast<int>(detail::wrap(t.rank() - 1, n));
  for (int step = 0; step < n - 1; ++step) {
    const std::size_t send_block = detail::wrap(t.rank() - step, n);
    const std::size_t recv_block = detail::wrap(t.rank() - step - 1, n);
    t.sendrecv(right, std::as_bytes(all.subspan(send_block * m, m)), left,
               std::as_writable_bytes(all.subspan(recv_block * m, m)), tags::allgather);
  }
}

/// Copies `data` from `root` to every rank (binomial tree: log2(N) rounds).
template <transport T, class V>
requires std::is_trivially_copyable_v<V>
void broadcast(T& t, std::span<V> data, int root = 0) {
  const int n = t.size();
  STRATA_EXPECTS(root >= 0 && root < n, "broadcast: root ", root, " outside ", n, " ranks");
  const int relative = static_cast<int>(detail::wrap(t.rank() - root, n));
  int mask = 1;
  while (mask < n) {  // receive from the parent
    if (relative & mask) {
      const int parent = static_cast<int>(detail::wrap(relative - mask + root, n));
      t.recv(parent, tags::broadcast, std::as_writable_bytes(data));
      break;
    }
    mask <<= 1;
  }
  mask >>= 1;
  while (mask > 0) {  // send to the children
    if (relative + mask < n) {
      const int child = static_cast<int>(detail::wrap(relative + mask + root, n));
      t.send(child, tags::broadcast, std::as_bytes(data));
    }
    mask >>= 1;
  }
}

/// Returns when every rank has entered the barrier (dissemination: ceil(log2 N) rounds).
/// `tag` names the protocol it belongs to (e.g. `tags::checkpoint` for a checkpoint's
/// barriers), so a timeout or an injected fault names that phase.
template <transport T>
void barrier(T& t, tag_t tag = tags::barrier) {
  const int n = t.size();
  std::byte token{}, incoming{};
  for (int distance = 1; distance < n; distance <<= 1) {
    const int to = static_cast<int>(detail::wrap(t.rank() + distance, n));
    const int from = static_cast<int>(detail::wrap(t.rank() - distance, n));
    t.sendrecv(to, std::span(&token, 1), from, std::span(&incoming, 1), tag);
  }
}

}  // namespace strata::comm

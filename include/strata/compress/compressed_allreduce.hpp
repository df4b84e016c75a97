/// @file compressed_allreduce.hpp
/// Ring allreduce whose messages are compressed by any `compressor`: each hop of the
/// reduce-scatter carries an encoded chunk that the receiver `decode_add`s, and each finished
/// segment is encoded once by its owner and forwarded unchanged in the all-gather, so every
/// rank ends with bit-identical values.
///
/// ```cpp
/// strata::comm::thread_world(4).run([](strata::comm::thread_transport& t) {
///   std::vector<float> grad(1 << 20, 1.0f);
///   strata::compress::error_feedback<strata::compress::int8_block<256>> codec(grad.size());
///   strata::compress::compressed_allreduce(t, std::span(grad), codec);  // ≈ 4.0 everywhere
/// });
/// ```
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/compress/concepts.hpp"
#include "strata/core/error.hpp"

namespace strata::compress {

/// Default chunk of `compressed_allreduce`: 2^18 floats (1 MiB of fp32) per message.
inline constexpr std::size_t default_chunk_floats = std::size_t{1} << 18;

namespace detail {

/// Sends `out` to `right` and receives the left neighbour's message (for `recv_count` values)
/// into `in`; returns the received bytes. A fixed-size codec's messages have a known size, so
/// one exact-size `sendrecv` suffices; otherwise the sizes are exchanged first (8 bytes), then
/// the payloads — `sendrecv` on any transport needs exact sizes, and a size larger than the
/// codec's bound for `recv_count` is refused as `errc::bad_message` before anything is read.
template <comm::transport T, compressor C>
std::span<const std::byte> exchange(T& t, const C& codec, int right, std::span<const std::byte> out,
                                    int left, std::size_t recv_count, std::vector<std::byte>& in) {
  const std::size_t bound = codec.max_encoded_bytes(recv_count);
  std::size_t incoming = bound;
  if constexpr (!fixed_size_compressor<C>) {
    const std::uint64_t mine = out.size();
    std::uint64_t theirs = 0;
    t.sendrecv(right, std::as_bytes(std::span(&mine, 1)), left,
               std::as_writable_bytes(std::span(&theirs, 1)), comm::tags::compressed_allreduce);
    if (theirs > bound)
      fail(errc::bad_message,
           cat("rank ", t.rank(), ": compressed_allreduce: rank ", left, " announced ", theirs,
               " bytes for ", recv_count, " values but ", C::name, " sends at most ", bound,
               "; do all ranks use the same codec settings?"));
    incoming = static_cast<std::size_t>(theirs);
  }
  if (in.size() < incoming) in.resize(incoming);
  std::span<std::byte> target(in.data(), incoming);
  t.sendrecv(right, out, left, target, comm::tags::compressed_allreduce);
  return target;
}

}  // namespace detail

/// Sums (or averages) `data` over all ranks in place, sending every value through `codec`.
///
/// Ring of N ranks: a reduce-scatter of N−1 hops, each sending one encoded chunk to the right
/// neighbour, which adds it with `decode_add`; then the owner of each finished segment encodes
/// it once, replaces its own copy by `decode(encode(segment))`, and those bytes travel
/// unchanged around the ring (each rank decodes and forwards them). Afterwards every rank holds
/// bit-identical values. Each rank encodes each position exactly once per call, so a
/// `positional_compressor` (`error_feedback`) keeps one residual per position that records
/// every error this rank introduced; over many calls the running sum of results then tracks
/// the running sum of exact sums up to the current residuals, without drift.
///
/// Traffic per rank ≈ 2(N−1)/N · P · (encoded bytes per fp32 byte), plus 8 bytes for the length
/// check and, for variable-size codecs (topk), 8 bytes per message for its size. Messages hold
/// at most `chunk_floats` values (default 1 MiB of fp32). Result error vs the exact sum: the
/// reduce-scatter compresses partial sums N−1 times and the all-gather once, so a per-value
/// codec bound e(|v|) gives roughly Σ over those N encodings of e(partial sum).
///
/// With one rank `data` is left exactly as it is (nothing is sent, the codec is not used).
/// Every rank must pass the same length (else `errc::size_mismatch`) and equally configured
/// codecs (else `errc::bad_message` or `errc::size_mismatch`); a `positional_compressor` must
/// have `length() == data.size()`. Blocking; call from one thread per rank.
template <comm::transport T, compressor C>
void compressed_allreduce(T& t, std::span<float> data, C& codec,
                          comm::reduce_op op = comm::reduce_op::sum,
                          std::size_t chunk_floats = default_chunk_floats) {
  STRATA_EXPECTS(chunk_floats >= 1, "compressed_allreduce: chunk_floats must be at least 1");
  if constexpr (positional_compressor<C>)
    STRATA_EXPECTS(codec.length() == data.size(), "compressed_allreduce: rank ", t.rank(), "'s ",
                   C::name, " codec tracks ", codec.length(), " positions but the buffer has ",
                   data.size(), "; construct it with the buffer's length");
  const int n = t.size();
  comm::detail::check_same_count(t, data.size(), "compressed_allreduce");
  if (n == 1) return;
  const int rank = t.rank();
  const int right = static_cast<int>(comm::detail::wrap(rank + 1, n));
  const int left = static_cast<int>(comm::detail::wrap(rank - 1, n));
  const auto parts = static_cast<std::size_t>(n);
  const std::size_t longest = (data.size() + parts - 1) / parts;
  const std::size_t chunk = std::min(chunk_floats, std::max<std::size_t>(longest, 1));
  const auto seg = [&](long long i) {
    return comm::detail::split(data.size(), parts, comm::detail::wrap(i, n));
  };
  // Values of segment `s` in the chunk at `offset` (0 past the segment's end).
  const auto chunk_of = [&](comm::detail::segment s, std::size_t offset) {
    const std::size_t len = s.size() > offset ? std::min(chunk, s.size() - offset) : 0;
    return std::pair{s.begin + std::min(offset, s.size()), len};
  };
  std::vector<std::byte> outgoing(codec.max_encoded_bytes(chunk)), incoming(outgoing.size());

  // Reduce-scatter, chunk by chunk: after n-1 hops rank r holds the sum of segment r+1.
  // Every rank runs the same sequence of (chunk, hop) exchanges, so sends and receives pair up.
  for (std::size_t offset = 0; offset < longest; offset += chunk) {
    for (int step = 0; step < n - 1; ++step) {
      const auto [send_at, send_n] = chunk_of(seg(rank - step), offset);
      const auto [recv_at, recv_n] = chunk_of(seg(rank - step - 1), offset);
      const std::size_t bytes =
          detail::encode_at(codec, send_at, std::span<const float>(data.subspan(send_at, send_n)),
                            std::span(outgoing));
      const auto received =
          detail::exchange(t, codec, right, std::span<const std::byte>(outgoing.data(), bytes),
                           left, recv_n, incoming);
      codec.decode_add(received, data.subspan(recv_at, recv_n));
    }
  }
  const auto owned = seg(rank + 1);
  if (op == comm::reduce_op::mean) comm::detail::divide(data.subspan(owned.begin, owned.size()), n);

  // All-gather: the owner encodes each finished chunk once and adopts its decoded value; the
  // bytes then go around the ring unchanged (received at one hop, forwarded at the next).
  for (std::size_t offset = 0; offset < longest; offset += chunk) {
    const auto [own_at, own_n] = chunk_of(owned, offset);
    std::size_t bytes = detail::encode_at(
        codec, own_at, std::span<const float>(data.subspan(own_at, own_n)), std::span(outgoing));
    codec.decode(std::span<const std::byte>(outgoing.data(), bytes), data.subspan(own_at, own_n));
    for (int step = 0; step < n - 1; ++step) {
      const auto [recv_at, recv_n] = chunk_of(seg(rank - step), offset);
      const auto received =
          detail::exchange(t, codec, right, std::span<const std::byte>(outgoing.data(), bytes),
                           left, recv_n, incoming);
      codec.decode(received, data.subspan(recv_at, recv_n));
      bytes = received.size();
      std::swap(outgoing, incoming);  // forward what arrived
    }
  }
}

}  // namespace strata::compress

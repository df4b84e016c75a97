/// @file transport.hpp
/// `strata::mpi::transport`: processes (on one host or many) as the ranks of a
/// `strata::comm::transport`, through MPI point-to-point messages on a private communicator.
///
/// ```cpp
/// strata::mpi::environment env(argc, argv);        // MPI_THREAD_MULTIPLE
/// strata::mpi::transport t({.timeout_seconds = 30});
/// std::vector<float> grad(1000, float(t.rank()));
/// strata::comm::allreduce(t, std::span(grad));     // the same ring as on thread_world
/// ```
///
/// Every blocking call is non-blocking MPI (MPI_Isend / MPI_Irecv / MPI_Improbe + MPI_Imrecv)
/// polled with MPI_Test: a short spin (yielding the core), then sleeps backing off to
/// `transport_options::max_sleep_seconds`. A peer that never answers therefore ends in
/// `errc::timeout` naming rank, peer and tag — never a hang.
///
/// Tags: MPI only guarantees tags up to MPI_TAG_UB ≥ 32767, while strata's tags are 32-bit
/// (its own protocols use 0x8000'0000 and up). `to_mpi_tag` maps them one-to-one into the
/// valid range: user tags [0, H) stay as they are and reserved tag `0x8000'0000 + k` becomes
/// `H + k`, with H = (MPI_TAG_UB + 1) / 2 (16384 at the standard's minimum, 2^30 in Open MPI).
/// A tag that does not fit raises `errc::unsupported` — two strata tags never share an MPI tag.
#pragma once

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/core/error.hpp"

namespace strata::mpi {

/// Settings of an MPI transport.
struct transport_options {
  double timeout_seconds = 60.0;  ///< every blocking operation ends within this
  /// How long a blocked call polls MPI_Test back to back (yielding the core between polls)
  /// before it starts to sleep: MPI makes progress on large messages only inside MPI calls,
  /// so polling keeps the copy going; sleeping keeps an idle rank off the CPU.
  double spin_seconds = 1e-3;
  double max_sleep_seconds = 100e-6;  ///< longest sleep between two polls
};

namespace detail {

using clock = std::chrono::steady_clock;

/// MPI's text for an error code.
inline std::string error_string(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(rc, text, &length) != MPI_SUCCESS) return cat("MPI error ", rc);
  return std::string(text, static_cast<std::size_t>(length));
}

/// Raises `errc::internal` naming the MPI call and MPI's message unless `rc` is MPI_SUCCESS.
inline void check(int rc, std::string_view call) {
  if (rc != MPI_SUCCESS) [[unlikely]]
    fail(errc::internal, cat(call, " failed: ", error_string(rc), " (MPI error ", rc, ")"));
}

/// Whether `rc` says a receive buffer was too small.
inline bool is_truncation(int rc) {
  int error_class = 0;
  MPI_Error_class(rc, &error_class);
  return error_class == MPI_ERR_TRUNCATE;
}

/// Polls with a deadline: `pause()` yields during the spin phase, then sleeps with a doubling
/// back-off capped at `max_sleep`.
class poller {
 public:
  poller(double timeout, const transport_options& options)
      : start_(clock::now()),
        deadline_(start_ + std::chrono::duration_cast<clock::duration>(
                               std::chrono::duration<double>(timeout))),
        spin_(std::chrono::duration_cast<clock::duration>(
            std::chrono::duration<double>(options.spin_seconds))),
        max_sleep_(options.max_sleep_seconds) {}
  [[nodiscard]] bool expired() const { return clock::now() >= deadline_; }
  void pause() {
    if (clock::now() - start_ < spin_) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(sleep_));
    sleep_ = std::min(sleep_ * 2, max_sleep_);
  }

 private:
  clock::time_point start_, deadline_;
  clock::duration spin_;
  double max_sleep_;
  double sleep_ = 1e-6;
};

/// A non-blocking operation whose buffer we own (a buffered send, or a receive we gave up on).
struct in_flight {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<std::byte> bytes;
  int peer = -1;
  comm::tag_t tag = 0;
};

/// Operations still running when their transport was destroyed: their buffers are kept until
/// the process exits (after MPI_Finalize), because MPI may still read or write them.
inline void bury(std::list<in_flight>&& operations) {
  static std::mutex mutex;
  static std::list<in_flight> graveyard;
  std::lock_guard lock(mutex);
  graveyard.splice(graveyard.end(), operations);
}

}  // namespace detail

/// MPI tag of strata tag `tag` when MPI allows tags up to `tag_ub`: user tags [0, H) map to
/// themselves and reserved tags `comm::reserved_tag_base + k` to `H + k`, H = (tag_ub + 1) / 2.
/// One-to-one; a tag outside both ranges raises `errc::unsupported`. O(1), pure.
[[nodiscard]] constexpr int to_mpi_tag(comm::tag_t tag, int tag_ub) {
  const std::int64_t ub = tag_ub;
  const std::int64_t half = (ub + 1) / 2;
  if (tag < comm::reserved_tag_base) {
    if (static_cast<std::int64_t>(tag) >= half)
      fail(errc::unsupported, cat("mpi::transport: user tag ", tag, " does not fit: this MPI ",
                                  "allows tags up to ", ub, ", so user tags must be below ", half));
    return static_cast<int>(tag);
  }
  const std::int64_t offset = static_cast<std::int64_t>(tag - comm::reserved_tag_base);
  if (offset > ub - half)
    fail(errc::unsupported, cat("mpi::transport: reserved tag 0x8000'0000 + ", offset,
                                " does not fit below this MPI's tag limit ", ub));
  return static_cast<int>(half + offset);
}

/// One process's endpoint of a communicator of MPI processes; models `comm::transport`.
///
/// - Runs on its own communicator (MPI_Comm_dup of the one given, MPI_COMM_WORLD by default,
///   with MPI_ERRORS_RETURN), so the program's own MPI traffic never meets strata's.
/// - `send` copies the bytes and returns at once (MPI_Isend from the copy; finished sends are
///   reaped on later calls, `flush()` waits for all). `sendrecv` sends from the caller's
///   buffer (no copy) and pre-posts the receive. `recv` / `recv_message` / `recv_any` probe
///   (MPI_Improbe), check the size, then receive the matched message (MPI_Imrecv).
/// - A message of the wrong size raises `errc::size_mismatch` naming rank, peer and tag (the
///   message is consumed, so the stream stays aligned). A peer that does not answer within
///   `timeout_seconds()` raises `errc::timeout` naming rank, peer and tag. If MPI may still
///   use a caller's buffer after a timeout (a sendrecv whose send was never received), the
///   transport refuses further calls with `errc::aborted`: stop, or call `abort()`.
/// - A dead peer process: Open MPI's launcher normally stops the whole job; if it does not,
///   the survivors' calls time out naming the peer.
/// - Thread-safe as the concept asks (needs MPI_THREAD_MULTIPLE; see `environment`): several
///   threads may use one endpoint with different (peer, tag) pairs; counters are atomic.
/// Costs: one copy per `send`; each wait polls MPI_Test (spin ≤ `spin_seconds`, then sleeps).
/// Not copyable or movable; destroy it before MPI_Finalize (i.e. before the environment).
class transport {
 public:
  /// An endpoint on a duplicate of MPI_COMM_WORLD (collective: every process constructs one).
  explicit transport(transport_options options = {}) : transport(MPI_COMM_WORLD, options) {}

  /// An endpoint on a duplicate of `base` (collective over `base`).
  transport(MPI_Comm base, transport_options options) : options_(options) {
    STRATA_EXPECTS(options.timeout_seconds > 0, "mpi::transport: timeout_seconds must be positive");
    STRATA_EXPECTS(options.spin_seconds >= 0 && options.max_sleep_seconds >= 0,
                   "mpi::transport: spin_seconds and max_sleep_seconds must be >= 0");
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      fail(errc::unsupported,
           "mpi::transport: MPI is not initialised; construct a "
           "strata::mpi::environment first (at the top of main)");
    detail::check(MPI_Comm_dup(base, &comm_), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    int* ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &found);
    tag_ub_ = found && ub != nullptr ? *ub : 32767;
    timeout_.store(options.timeout_seconds);
    sent_ = std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(size_));
    received_ = std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(size_));
  }

  transport(const transport&) = delete;
  transport& operator=(const transport&) = delete;

  /// Waits (up to the timeout) for buffered sends, then frees the communicator. Never throws:
  /// a problem is printed to stderr.
  ~transport() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) {  // misuse: MPI is gone; just keep the buffers alive
      detail::bury(std::move(pending_));
      detail::bury(std::move(orphans_));
      return;
    }
    if (!broken_.load()) {
      try {
        flush();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "strata: mpi::transport on rank %d, at destruction: %s\n", rank_,
                     e.what());
      }
    }
    std::lock_guard lock(pending_mutex_);
    for (auto* operations : {&pending_, &orphans_})
      for (auto& op : *operations)
        if (op.request != MPI_REQUEST_NULL) MPI_Request_free(&op.request);
    detail::bury(std::move(pending_));
    detail::bury(std::move(orphans_));
    MPI_Comm_free(&comm_);
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The private communicator (for policies such as `native_allreduce`).
  [[nodiscard]] MPI_Comm communicator() const noexcept { return comm_; }
  /// Largest MPI tag of this library (MPI_TAG_UB).
  [[nodiscard]] int tag_ub() const noexcept { return tag_ub_; }

  [[nodiscard]] double timeout_seconds() const noexcept {
    return timeout_.load(std::memory_order_relaxed);
  }
  /// Changes the timeout of this endpoint's blocking operations.
  void set_timeout(double seconds) {
    STRATA_EXPECTS(seconds > 0, "mpi::transport: timeout must be positive, got ", seconds);
    timeout_.store(seconds, std::memory_order_relaxed);
  }

  /// Payload bytes sent to `peer` (counted when a send is posted).
  [[nodiscard]] std::uint64_t bytes_sent_to(int peer) const {
    check_peer(peer, "bytes_sent_to");
    return sent_[static_cast<std::size_t>(peer)].load(std::memory_order_relaxed);
  }
  /// Payload bytes received from `peer`.
  [[nodiscard]] std::uint64_t bytes_received_from(int peer) const {
    check_peer(peer, "bytes_received_from");
    return received_[static_cast<std::size_t>(peer)].load(std::memory_order_relaxed);
  }

  /// Buffered send: copies `bytes`, posts MPI_Isend and returns.
  void send(int peer, comm::tag_t tag, std::span<const std::byte> bytes) {
    const int mpi_tag = prepare(peer, tag, bytes.size(), "send");
    detail::in_flight op{MPI_REQUEST_NULL, std::vector<std::byte>(bytes.begin(), bytes.end()), peer,
                         tag};
    std::lock_guard lock(pending_mutex_);
    reap_locked();
    detail::check(MPI_Isend(op.bytes.data(), static_cast<int>(op.bytes.size()), MPI_BYTE, peer,
                            mpi_tag, comm_, &op.request),
                  "MPI_Isend");
    sent_[static_cast<std::size_t>(peer)].fetch_add(bytes.size(), std::memory_order_relaxed);
    pending_.push_back(std::move(op));
  }

  /// Receives exactly `bytes.size()` bytes from `peer` with `tag`.
  void recv(int peer, comm::tag_t tag, std::span<std::byte> bytes) {
    const int mpi_tag = prepare(peer, tag, bytes.size(), "recv");
    const matched m = probe(peer, mpi_tag, tag, "recv");
    if (m.count != bytes.size()) {
      std::vector<std::byte> discard(m.count);  // consume it: the next message stays in order
      receive(m, discard, tag, "recv");
      fail(errc::size_mismatch,
           cat("rank ", rank_, ": message from peer ", peer, " (tag ", tag, ") has ", m.count,
               " bytes but ", bytes.size(), " were expected; do both ranks pass the same length?"));
    }
    receive_into(m, bytes, tag, "recv");
  }

  /// Receives a message of any size from `peer` with `tag`.
  std::vector<std::byte> recv_message(int peer, comm::tag_t tag) {
    const int mpi_tag = prepare(peer, tag, 0, "recv_message");
    const matched m = probe(peer, mpi_tag, tag, "recv_message");
    std::vector<std::byte> out(m.count);
    receive(m, out, tag, "recv_message");
    return out;
  }

  /// Receives the next message with `tag` from any rank.
  comm::message recv_any(comm::tag_t tag) {
    const int mpi_tag = prepare(-1, tag, 0, "recv_any");
    const matched m = probe(MPI_ANY_SOURCE, mpi_tag, tag, "recv_any");
    comm::message out;
    out.source = m.source;
    out.tag = tag;
    out.bytes.resize(m.count);
    receive(m, out.bytes, tag, "recv_any");
    return out;
  }

  /// Sends `out` to `to` and receives exactly `in.size()` bytes from `from`, concurrently
  /// (pre-posted MPI_Irecv + MPI_Isend from `out`, no copies): no deadlock in a ring.
  void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in,
                comm::tag_t tag) {
    const int mpi_tag = prepare(to, tag, out.size(), "sendrecv");
    (void)prepare(from, tag, in.size(), "sendrecv");
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
    detail::check(MPI_Irecv(in.data(), static_cast<int>(in.size()), MPI_BYTE, from, mpi_tag, comm_,
                            &requests[0]),
                  "MPI_Irecv");
    int rc = MPI_Isend(out.data(), static_cast<int>(out.size()), MPI_BYTE, to, mpi_tag, comm_,
                       &requests[1]);
    if (rc != MPI_SUCCESS) {
      cancel_receive(requests[0], {}, from, tag);
      detail::check(rc, "MPI_Isend");
    }
    sent_[static_cast<std::size_t>(to)].fetch_add(out.size(), std::memory_order_relaxed);
    bool received = false, sent = false;
    int receive_rc = MPI_SUCCESS;
    MPI_Status status;
    detail::poller wait(timeout_seconds(), options_);
    for (;;) {
      int flag = 0;
      if (!received) {
        const int r = MPI_Test(&requests[0], &flag, &status);
        if (r != MPI_SUCCESS || flag) {
          received = true;
          receive_rc = r;
        }
      }
      if (!sent) {
        detail::check(MPI_Test(&requests[1], &flag, MPI_STATUS_IGNORE), "MPI_Test (sendrecv)");
        sent = flag != 0;
      }
      if (received && sent) break;
      if (wait.expired()) {
        const std::string what = !received ? cat("the message from peer ", from, " has not arrived")
                                           : cat("peer ", to, " has not received our message");
        if (!received) cancel_receive(requests[0], {}, from, tag);
        if (!sent)
          poison(cat("rank ", rank_, ": a sendrecv to peer ", to, " (tag ", tag,
                     ") timed out while MPI may still read the caller's buffer"),
                 requests[1], to, tag);
        fail(errc::timeout,
             cat("rank ", rank_, ": sendrecv to peer ", to, " / from peer ", from, " (tag ", tag,
                 ") timed out after ", timeout_seconds(), " s: ", what,
                 "; is that peer still running and using this tag? "
                 "(raise transport_options::timeout_seconds for slow steps)"));
      }
      wait.pause();
    }
    if (receive_rc != MPI_SUCCESS) {
      if (detail::is_truncation(receive_rc))
        fail(errc::size_mismatch, cat("rank ", rank_, ": message from peer ", from, " (tag ", tag,
                                      ") has more than the ", in.size(),
                                      " bytes expected; do both ranks pass the same length?"));
      detail::check(receive_rc, "MPI_Test (sendrecv receive)");
    }
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    received_[static_cast<std::size_t>(from)].fetch_add(static_cast<std::uint64_t>(count),
                                                        std::memory_order_relaxed);
    if (static_cast<std::size_t>(count) != in.size())
      fail(errc::size_mismatch,
           cat("rank ", rank_, ": message from peer ", from, " (tag ", tag, ") has ", count,
               " bytes but ", in.size(), " were expected; do both ranks pass the same length?"));
  }

  /// Waits until every buffered send was taken by its receiver; `errc::timeout` naming the
  /// first peer and tag still pending after `timeout_seconds()`.
  void flush() {
    detail::poller wait(timeout_seconds(), options_);
    for (;;) {
      {
        std::lock_guard lock(pending_mutex_);
        reap_locked();
        if (pending_.empty()) return;
        if (wait.expired()) {
          const auto& first = pending_.front();
          fail(errc::timeout,
               cat("rank ", rank_, ": ", pending_.size(), " buffered send(s) not received within ",
                   timeout_seconds(), " s (the first to peer ", first.peer, ", tag ", first.tag,
                   "); is that peer still running and receiving this tag?"));
        }
      }
      wait.pause();
    }
  }

  /// Buffered sends not yet known to be complete.
  [[nodiscard]] std::size_t pending_sends() {
    std::lock_guard lock(pending_mutex_);
    reap_locked();
    return pending_.size();
  }

  /// Completes `request`, a non-blocking MPI operation the caller started on `communicator()`
  /// (e.g. MPI_Iallreduce), polling like every blocking call. On timeout raises
  /// `errc::timeout` with `what` and marks the transport unusable (MPI still owns the
  /// operation's buffers).
  void wait(MPI_Request& request, std::string_view what) {
    throw_if_broken(what);
    detail::poller poll(timeout_seconds(), options_);
    for (;;) {
      int flag = 0;
      detail::check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), what);
      if (flag) return;
      if (poll.expired()) {
        const std::string message =
            cat("rank ", rank_, ": ", what, " did not finish within ", timeout_seconds(),
                " s; is every rank still running and calling it?");
        poison(message, request, -1, 0);
        fail(errc::timeout, message);
      }
      poll.pause();
    }
  }

  /// Last resort on a fatal error: prints `message` (with this rank) to stderr and calls
  /// MPI_Abort, which stops every process of the job. Does not return.
  [[noreturn]] void abort(std::string_view message, int code = 1) const noexcept {
    std::fprintf(stderr, "strata: rank %d: fatal: %.*s; calling MPI_Abort\n", rank_,
                 static_cast<int>(message.size()), message.data());
    std::fflush(stderr);
    MPI_Abort(comm_, code);
    std::abort();
  }

 private:
  struct matched {
    MPI_Message message = MPI_MESSAGE_NULL;
    std::size_t count = 0;
    int source = -1;
  };

  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= size_)
      fail(errc::out_of_range, cat("rank ", rank_, ": ", what, " with peer ", peer,
                                   " outside the world of ", size_, " ranks"));
  }
  void throw_if_broken(std::string_view what) const {
    if (broken_.load()) {
      std::lock_guard lock(pending_mutex_);
      fail(errc::aborted, cat("rank ", rank_, ": ", what, " refused: ", broken_reason_,
                              "; this transport cannot be used any more (stop, or call abort())"));
    }
  }
  /// Common checks; returns the MPI tag. `peer` −1 = any source.
  int prepare(int peer, comm::tag_t tag, std::size_t bytes, const char* what) const {
    if (peer != -1) check_peer(peer, what);
    throw_if_broken(what);
    if (bytes > static_cast<std::size_t>(INT_MAX))
      fail(errc::unsupported, cat("rank ", rank_, ": ", what, " of ", bytes,
                                  " bytes: MPI messages are limited to 2^31-1 bytes; split it"));
    return to_mpi_tag(tag, tag_ub_);
  }

  /// Marks the transport unusable and keeps `request` (MPI may still use its buffer).
  void poison(std::string reason, MPI_Request& request, int peer, comm::tag_t tag) {
    std::lock_guard lock(pending_mutex_);
    if (!broken_.load()) broken_reason_ = std::move(reason);
    broken_.store(true);
    orphans_.push_back({std::exchange(request, MPI_REQUEST_NULL), {}, peer, tag});
  }

  /// Cancels an unmatched receive; if it cannot be cancelled (a message is arriving into
  /// `owned`, or into a caller's buffer when `owned` is empty), keeps it as an orphan.
  void cancel_receive(MPI_Request& request, std::vector<std::byte> owned, int peer,
                      comm::tag_t tag) {
    MPI_Cancel(&request);
    detail::poller wait(0.2, options_);
    for (;;) {
      int flag = 0;
      if (MPI_Test(&request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag) return;
      if (wait.expired()) break;
      wait.pause();
    }
    if (owned.empty()) {
      poison(cat("rank ", rank_, ": a receive from peer ", peer, " (tag ", tag,
                 ") timed out while MPI was still writing the caller's buffer"),
             request, peer, tag);
      return;
    }
    std::lock_guard lock(pending_mutex_);
    orphans_.push_back({std::exchange(request, MPI_REQUEST_NULL), std::move(owned), peer, tag});
  }

  /// Frees finished buffered sends; `pending_mutex_` held.
  void reap_locked() {
    for (auto it = pending_.begin(); it != pending_.end();) {
      int flag = 0;
      detail::check(MPI_Test(&it->request, &flag, MPI_STATUS_IGNORE), "MPI_Test (send)");
      it = flag ? pending_.erase(it) : std::next(it);
    }
  }

  /// Polls MPI_Improbe until a message from `source` with `mpi_tag` is matched.
  matched probe(int source, int mpi_tag, comm::tag_t tag, const char* what) {
    detail::poller wait(timeout_seconds(), options_);
    MPI_Status status;
    matched m;
    for (;;) {
      int flag = 0;
      detail::check(MPI_Improbe(source, mpi_tag, comm_, &flag, &m.message, &status), "MPI_Improbe");
      if (flag) break;
      if (wait.expired())
        fail(errc::timeout,
             cat("rank ", rank_, ": ", what, " from ",
                 source == MPI_ANY_SOURCE ? std::string("any peer") : cat("peer ", source),
                 " (tag ", tag, ") timed out after ", timeout_seconds(),
                 " s; is that peer still running and sending with this tag? "
                 "(raise transport_options::timeout_seconds for slow steps)"));
      wait.pause();
    }
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    m.count = static_cast<std::size_t>(count);
    m.source = status.MPI_SOURCE;
    return m;
  }

  /// Receives matched message `m` into `owned` (a buffer of ours, kept alive on timeout).
  void receive(const matched& m, std::vector<std::byte>& owned, comm::tag_t tag, const char* what) {
    MPI_Request request = start_receive(m, owned.data(), owned.size());
    if (!finish_receive(request, m, what)) {
      cancel_receive(request, std::move(owned), m.source, tag);
      fail_receive_timeout(m, tag, what);
    }
  }
  /// Receives matched message `m` into the caller's buffer.
  void receive_into(const matched& m, std::span<std::byte> bytes, comm::tag_t tag,
                    const char* what) {
    MPI_Request request = start_receive(m, bytes.data(), bytes.size());
    if (!finish_receive(request, m, what)) {
      cancel_receive(request, {}, m.source, tag);
      fail_receive_timeout(m, tag, what);
    }
  }
  MPI_Request start_receive(const matched& m, std::byte* data, std::size_t size) {
    MPI_Request request = MPI_REQUEST_NULL;
    MPI_Message message = m.message;
    detail::check(MPI_Imrecv(data, static_cast<int>(size), MPI_BYTE, &message, &request),
                  "MPI_Imrecv");
    return request;
  }
  bool finish_receive(MPI_Request& request, const matched& m, const char* what) {
    detail::poller wait(timeout_seconds(), options_);
    for (;;) {
      int flag = 0;
      detail::check(MPI_Test(&request, &flag, MPI_STATUS_IGNORE), what);
      if (flag) {
        received_[static_cast<std::size_t>(m.source)].fetch_add(m.count, std::memory_order_relaxed);
        return true;
      }
      if (wait.expired()) return false;
      wait.pause();
    }
  }
  [[noreturn]] void fail_receive_timeout(const matched& m, comm::tag_t tag, const char* what) {
    fail(errc::timeout, cat("rank ", rank_, ": ", what, " from peer ", m.source, " (tag ", tag,
                            "): the message of ", m.count, " bytes started but did not finish ",
                            "within ", timeout_seconds(), " s; is that peer still running?"));
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  int tag_ub_ = 32767;
  transport_options options_;
  std::atomic<double> timeout_{60.0};
  std::unique_ptr<std::atomic<std::uint64_t>[]> sent_, received_;  ///< per peer
  mutable std::mutex pending_mutex_;      ///< guards pending_, orphans_, broken_reason_
  std::list<detail::in_flight> pending_;  ///< buffered sends in flight
  std::list<detail::in_flight> orphans_;  ///< operations given up on (MPI may still use them)
  std::atomic<bool> broken_{false};
  std::string broken_reason_;
};

static_assert(comm::transport<transport>);

}  // namespace strata::mpi

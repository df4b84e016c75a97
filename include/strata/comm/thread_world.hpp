/// @file thread_world.hpp
/// N ranks as threads of one process: the default transport of strata and its cluster
/// rehearsal tool (per-link bandwidth/latency emulation, stragglers, fault plans: drop, delay,
/// corrupt or kill a rank's n-th send of a phase; optional per-message checksums).
///
/// ```cpp
/// strata::comm::thread_world(4).run([](strata::comm::thread_transport& t) {
///   std::vector<float> grad(1000, float(t.rank()));
///   strata::comm::allreduce(t, std::span(grad));   // every rank now holds 0+1+2+3
/// });
/// ```
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/comm/fault.hpp"
#include "strata/comm/phase.hpp"
#include "strata/core/checksum.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

/// An emulated network: each message takes `latency_seconds` plus size / bandwidth. Which
/// messages queue behind each other depends on `per_rank_nic`:
/// - false (a dedicated link per pair of ranks): messages on one (source, destination) link
///   queue; a rank talking to k peers at once moves k × the bandwidth.
/// - true (one full-duplex network interface per rank, as hosts on a switch): a message is sent
///   on its sender's outgoing side for size / bandwidth, after the sender's earlier messages,
///   and delivered on its receiver's incoming side for size / bandwidth in the first interval
///   that side is free from the moment its sending starts (a switch port: the side is never
///   idle while a message waits for it, whatever order the messages were posted in). The
///   switch buffers between the two sides, so a sender whose receiver is busy goes on with its
///   next message to another rank (no head-of-line blocking). A server answering 8
///   workers shares its one interface between them: the traffic concentration a parameter
///   server meets on a real network.
struct link_model {
  double latency_seconds = 0.0;
  double bandwidth_bytes_per_second = 0.0;  ///< 0 = unlimited (shared memory speed)
  bool per_rank_nic = false;                ///< see above
  [[nodiscard]] bool emulated() const noexcept {
    return latency_seconds > 0 || bandwidth_bytes_per_second > 0;
  }
};

/// Settings of a thread_world.
struct world_options {
  double timeout_seconds = 60.0;  ///< every blocking operation ends within this
  link_model link{};              ///< applied to every link between distinct ranks
  /// Per-rank extra delay added before each message the rank sends (a straggler); empty = none.
  std::vector<double> send_delay_seconds{};
  /// Per-rank fault injection: the rank fails on its k-th send (1-based); 0 = never.
  std::vector<std::uint64_t> fail_on_send{};
  /// Fault plan: each entry drops, delays, corrupts or fails one send of one rank (fault.hpp);
  /// checked when the world is made (a bad plan raises errc::invalid_argument). A plan turns
  /// `checksums` on.
  std::vector<fault> faults{};
  /// Every message carries a checksum of its bytes, taken at the send and verified at the
  /// receive, and a sequence number per (source, destination, tag): a message changed in
  /// flight, or one that arrives after a lost one, raises errc::bad_message naming rank, peer
  /// and phase.
  /// Off by default: it costs two passes over every message (docs/reliability.md).
  bool checksums = false;
  /// Names the phase of a message from its tag and bytes, for fault plans and errors (a
  /// trainer passes `ps::message_phase`, which tells PS pulls from pushes); nullptr = the tag.
  phase_classifier classify = nullptr;
  /// How long a blocked rank polls for its message before it sleeps on a condition variable:
  /// a wake-up through the kernel costs ~10 µs, which dominates small messages. The poll
  /// yields the core every few hundred cycles, so an oversubscribed or busy machine still
  /// runs the rank being waited for. 0 = sleep at once.
  double spin_seconds = 50e-6;
};

namespace detail {

using clock = std::chrono::steady_clock;

/// One queued message: either owned bytes (eager send) or a borrowed span (rendezvous send
/// from sendrecv, copied straight into the receiver's buffer).
/// A rendezvous message normally borrows the sender's buffer; one corrupted in flight carries
/// an owned (damaged) copy instead, and keeps its rendezvous state for the sender to wait on.
struct envelope {
  int source = -1;
  tag_t tag = 0;
  std::vector<std::byte> owned;
  const std::byte* borrowed = nullptr;
  std::size_t borrowed_size = 0;
  struct rendezvous_state* rendezvous = nullptr;
  clock::time_point ready{};
  std::uint64_t checksum = 0;  ///< of the bytes as sent (world_options::checksums)
  std::uint64_t sequence = 0;  ///< 1, 2, … per (source, destination, tag) (with checksums)
  phase what = phase::any;     ///< the phase the sender classified it as (checksums or faults)
  [[nodiscard]] bool borrows() const noexcept { return borrowed != nullptr; }
  [[nodiscard]] std::size_t size() const noexcept {
    return borrows() ? borrowed_size : owned.size();
  }
  [[nodiscard]] std::span<const std::byte> payload() const noexcept {
    return borrows() ? std::span<const std::byte>(borrowed, borrowed_size)
                     : std::span<const std::byte>(owned);
  }
};

/// Lifecycle of a rendezvous send: posted → taken (receiver copying) → done.
struct rendezvous_state {
  enum class phase { posted, taken, done } state = phase::posted;
};

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

/// A rank's incoming messages. Every change is made under `mutex` and announced by
/// `touch_and_wake()`: waiters first poll `version` (no system call), then sleep on `changed`.
struct mailbox {
  std::mutex mutex;
  std::condition_variable changed;
  std::atomic<std::uint64_t> version{0};  ///< bumped on every change a waiter may care about
  int sleepers = 0;                       ///< threads blocked on `changed` (under `mutex`)
  std::deque<envelope> queue;
  std::vector<clock::time_point> link_free;  ///< per source: when its emulated link is idle
  /// With checksums: per (source, tag), the sequence number of the last message sent here
  /// and of the last one taken: a gap is a message lost in flight.
  std::map<std::uint64_t, std::uint64_t> sent_sequence, taken_sequence;
  [[nodiscard]] static std::uint64_t stream(int source, tag_t tag) noexcept {
    return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(source)) << 32) | tag;
  }
  /// The number of a message `source` sent here with `tag` that is neither taken nor queued
  /// (lost in flight); 0 = none. Call with `mutex` held.
  [[nodiscard]] std::uint64_t lost(int source, tag_t tag) const {
    const auto sent = sent_sequence.find(stream(source, tag));
    if (sent == sent_sequence.end()) return 0;
    const auto taken = taken_sequence.find(stream(source, tag));
    const std::uint64_t next = (taken == taken_sequence.end() ? 0 : taken->second) + 1;
    if (sent->second < next) return 0;
    for (const auto& m : queue)
      if (m.source == source && m.tag == tag) return 0;  // on its way (a delayed message)
    return next;
  }
  /// A message `source` sent here, of any tag, that was lost: {tag, number}; {0, 0} = none.
  /// Call with `mutex` held.
  [[nodiscard]] std::pair<tag_t, std::uint64_t> lost_from(int source) const {
    for (auto it = sent_sequence.lower_bound(stream(source, 0));
         it != sent_sequence.end() && (it->first >> 32) == static_cast<std::uint32_t>(source);
         ++it) {
      const auto tag = static_cast<tag_t>(it->first & 0xFFFF'FFFFu);
      if (const std::uint64_t number = lost(source, tag); number != 0) return {tag, number};
    }
    return {0, 0};
  }

  /// Announces a change; call with `mutex` held.
  void touch_and_wake() {
    version.fetch_add(1, std::memory_order_release);
    if (sleepers > 0) changed.notify_all();
  }
  /// Waits (with `lock` on `mutex` held) until something changed, `until`, or a spurious
  /// wake-up; polls for up to `spin` seconds first. The caller re-checks its condition.
  void wait(std::unique_lock<std::mutex>& lock, clock::time_point until, double spin) {
    if (spin > 0) {
      const std::uint64_t seen = version.load(std::memory_order_relaxed);
      const auto spin_until =
          std::min(until, clock::now() + std::chrono::duration_cast<clock::duration>(
                                             std::chrono::duration<double>(spin)));
      lock.unlock();
      for (unsigned i = 1;; ++i) {
        if (version.load(std::memory_order_acquire) != seen) break;
        if (i % 64 == 0) {
          if (clock::now() >= spin_until) break;
          std::this_thread::yield();  // on a busy core, let the thread we wait for run
        }
        cpu_relax();
      }
      lock.lock();
      if (version.load(std::memory_order_relaxed) != seen || clock::now() >= until) return;
    }
    ++sleepers;
    changed.wait_until(lock, until);
    --sleepers;
  }
};

/// Large message buffers that receivers are done with (`give`), for senders to build their
/// next message in (`take`): a message sent with `send_owned` moves its vector to the receiver,
/// so without this a sender allocates (and the kernel zero-fills) a fresh buffer for every large
/// message — a parameter-server push of the dense parameters each step. Bounded: at most
/// `max_buffers` buffers and `max_bytes` bytes of capacity are kept; smaller buffers than
/// `min_bytes` are not worth keeping (malloc serves them from its free lists).
class buffer_pool {
 public:
  static constexpr std::size_t min_bytes = std::size_t{64} << 10;
  static constexpr std::size_t max_buffers = 16;
  static constexpr std::size_t max_bytes = std::size_t{256} << 20;

  /// The kept buffer of the smallest capacity ≥ `bytes` (its size and contents are what the
  /// last user left), or an empty vector when none is that large.
  [[nodiscard]] std::vector<std::byte> take(std::size_t bytes) {
    if (bytes < min_bytes) return {};
    std::lock_guard lock(mutex_);
    auto best = kept_.end();
    for (auto it = kept_.begin(); it != kept_.end(); ++it)
      if (it->capacity() >= bytes && (best == kept_.end() || it->capacity() < best->capacity()))
        best = it;
    if (best == kept_.end()) return {};
    std::vector<std::byte> out = std::move(*best);
    kept_.erase(best);
    held_ -= out.capacity();
    return out;
  }
  /// Keeps `buffer` for a later `take` if it is large enough and the bounds allow (else it is
  /// freed here).
  void give(std::vector<std::byte>&& buffer) {
    const std::size_t capacity = buffer.capacity();
    if (capacity < min_bytes) return;
    std::vector<std::byte> kept = std::move(buffer);
    std::lock_guard lock(mutex_);
    if (kept_.size() >= max_buffers || held_ + capacity > max_bytes) return;  // freed on return
    held_ += capacity;
    kept_.push_back(std::move(kept));
  }
  [[nodiscard]] std::size_t size() const {
    std::lock_guard lock(mutex_);
    return kept_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::vector<std::byte>> kept_;
  std::size_t held_ = 0;
};

struct world_state {
  int size = 0;
  world_options options;
  std::vector<std::unique_ptr<mailbox>> mailboxes;
  std::unique_ptr<std::atomic<std::uint64_t>[]> link_bytes_sent;      ///< [src * size + dst]
  std::unique_ptr<std::atomic<std::uint64_t>[]> link_bytes_received;  ///< [dst * size + src]
  std::atomic<bool> aborted{false};
  std::mutex abort_mutex;
  std::exception_ptr first_error;
  int first_failed_rank = -1;
  /// link_model::per_rank_nic: when each rank's outgoing / incoming interface is idle.
  std::mutex nic_mutex;
  /// Outgoing sides send in posting order; an incoming side delivers each message in the
  /// first free interval after its sending starts (nic_in_busy: the reserved intervals, by
  /// start, ending after now).
  std::vector<clock::time_point> nic_out_free;
  std::vector<std::vector<std::pair<clock::time_point, clock::time_point>>> nic_in_busy;
  bool checksums = false;  ///< options.checksums, or a fault plan
  /// Per fault of the plan: sends matched so far, and whether it acted (reset by each run).
  std::unique_ptr<std::atomic<std::uint64_t>[]> fault_matches;
  std::unique_ptr<std::atomic<bool>[]> fault_fired;
  /// Per rank: the (peer, tag) stream it waits on right now (`mailbox::stream` + 1; 0 = none
  /// or any peer). A rank that times out waiting on a peer that waits in turn defers, and the
  /// sender of a lost message defers to its receiver waiting for it (see receive()).
  std::unique_ptr<std::atomic<std::uint64_t>[]> waiting;
  /// Messages the fault plan dropped: in all, and per sending rank.
  std::atomic<int> dropped{0};
  std::atomic<bool> loss_reported{false};  ///< a receiver is raising the timeout of a lost one
  std::unique_ptr<std::atomic<int>[]> dropped_by;
  buffer_pool buffers;  ///< see thread_transport::take_buffer / recycle

  world_state(int n, world_options opts) : size(n), options(std::move(opts)) {
    checksums = options.checksums || !options.faults.empty();
    fault_matches = std::make_unique<std::atomic<std::uint64_t>[]>(options.faults.size());
    fault_fired = std::make_unique<std::atomic<bool>[]>(options.faults.size());
    nic_out_free.assign(static_cast<std::size_t>(n), clock::time_point{});
    nic_in_busy.resize(static_cast<std::size_t>(n));
    mailboxes.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      mailboxes.push_back(std::make_unique<mailbox>());
      mailboxes.back()->link_free.assign(static_cast<std::size_t>(n), clock::time_point{});
    }
    const auto links = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
    link_bytes_sent = std::make_unique<std::atomic<std::uint64_t>[]>(links);
    link_bytes_received = std::make_unique<std::atomic<std::uint64_t>[]>(links);
    waiting = std::make_unique<std::atomic<std::uint64_t>[]>(static_cast<std::size_t>(n));
    dropped_by = std::make_unique<std::atomic<int>[]>(static_cast<std::size_t>(n));
  }

  /// Whether rank `r` waits on a given peer other than `self` (waiting on `self`, it waits
  /// for the caller: no one to defer to); for r < 0, whether any rank but `self` waits.
  [[nodiscard]] bool waits(int r, int self = -1) const noexcept {
    if (r >= 0) {
      const std::uint64_t on = waiting[static_cast<std::size_t>(r)].load();
      return on != 0 && static_cast<int>((on - 1) >> 32) != self;
    }
    for (int q = 0; q < size; ++q)
      if (q != self && waiting[static_cast<std::size_t>(q)].load() != 0) return true;
    return false;
  }

  void abort(int rank, std::exception_ptr error) {
    {
      std::lock_guard lock(abort_mutex);
      if (!first_error) {
        first_error = std::move(error);
        first_failed_rank = rank;
      }
    }
    aborted.store(true);
    for (auto& box : mailboxes) {
      std::lock_guard lock(box->mutex);
      box->touch_and_wake();
    }
  }
};

}  // namespace detail

/// One rank's endpoint in a thread_world; models `transport`. Thread-safe (see the concept).
class thread_transport {
 public:
  thread_transport(detail::world_state& world, int rank)
      : world_(&world), rank_(rank), timeout_(world.options.timeout_seconds) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return world_->size; }
  [[nodiscard]] double timeout_seconds() const noexcept {
    return timeout_.load(std::memory_order_relaxed);
  }
  /// Changes the timeout of this endpoint's blocking operations.
  void set_timeout(double seconds) {
    STRATA_EXPECTS(seconds > 0, "thread_transport: timeout must be positive, got ", seconds);
    timeout_.store(seconds, std::memory_order_relaxed);
  }

  [[nodiscard]] std::uint64_t bytes_sent_to(int peer) const {
    check_peer(peer, "bytes_sent_to");
    return world_->link_bytes_sent[link(rank_, peer)].load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::uint64_t bytes_received_from(int peer) const {
    check_peer(peer, "bytes_received_from");
    return world_->link_bytes_received[link(rank_, peer)].load(std::memory_order_relaxed);
  }

  /// Buffered send: copies `bytes` and returns at once.
  void send(int peer, tag_t tag, std::span<const std::byte> bytes) {
    const send_action action = before_send(peer, tag, bytes, "send");
    detail::envelope message;
    message.source = rank_;
    message.tag = tag;
    message.owned.assign(bytes.begin(), bytes.end());
    post(peer, std::move(message), action);
  }

  /// Buffered send that takes `bytes`' storage instead of copying it (the receiver's
  /// recv_message / recv_any hands the same vector on): no copy at all in-process.
  void send_owned(int peer, tag_t tag, std::vector<std::byte>&& bytes) {
    const send_action action = before_send(peer, tag, bytes, "send");
    detail::envelope message;
    message.source = rank_;
    message.tag = tag;
    message.owned = std::move(bytes);
    post(peer, std::move(message), action);
  }

  /// A buffer of capacity ≥ `bytes` that a receiver handed back with `recycle` (an empty
  /// vector when none is that large, or for small messages): build the next message in it and
  /// `send_owned` it, and a large message costs no allocation. Shared by the world's ranks.
  [[nodiscard]] std::vector<std::byte> take_buffer(std::size_t bytes) {
    return world_->buffers.take(bytes);
  }
  /// Hands the buffer of a received message this rank is done with back for later sends
  /// (small buffers, and any beyond the pool's bounds, are freed).
  void recycle(std::vector<std::byte>&& bytes) { world_->buffers.give(std::move(bytes)); }

  /// Receives exactly `bytes.size()` bytes from `peer` with `tag`.
  void recv(int peer, tag_t tag, std::span<std::byte> bytes) {
    check_peer(peer, "recv");
    receive(peer, tag, "recv", [&](detail::envelope& message) {
      check_size(message, peer, tag, bytes.size());
      copy_payload(message, bytes.data());
    });
  }

  /// Receives a message of any size from `peer` with `tag`.
  std::vector<std::byte> recv_message(int peer, tag_t tag) {
    check_peer(peer, "recv_message");
    std::vector<std::byte> out;
    receive(peer, tag, "recv_message",
            [&](detail::envelope& message) { take_payload(message, out); });
    return out;
  }

  /// Receives the next message with `tag` from any rank.
  message recv_any(tag_t tag) {
    message out;
    out.tag = tag;
    receive(-1, tag, "recv_any", [&](detail::envelope& message) {
      out.source = message.source;
      take_payload(message, out.bytes);
    });
    return out;
  }

  /// Sends `out` to `to` and receives `in` from `from` at the same time. The send is a
  /// rendezvous: the receiver copies straight from `out` (one copy, no staging buffer).
  void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in,
                tag_t tag) {
    sendrecv_consume(to, out, from, in.size(), tag, [&](std::span<const std::byte> incoming) {
      if (!incoming.empty()) std::memcpy(in.data(), incoming.data(), incoming.size());
    });
  }

  /// Like sendrecv, but hands the incoming `in_bytes` bytes to `consume(std::span<const
  /// std::byte>)` where they lie (in the sender's buffer) instead of copying them: a reduction
  /// reads its operand straight from the peer. The span is valid only during the call; the
  /// sender stays blocked until `consume` returns. A message of another size raises
  /// `errc::size_mismatch` without calling `consume`. Models `consuming_transport`.
  template <class Consume>
  requires std::invocable<Consume&, std::span<const std::byte>>
  void sendrecv_consume(int to, std::span<const std::byte> out, int from, std::size_t in_bytes,
                        tag_t tag, Consume&& consume) {
    const send_action action = before_send(to, tag, out, "sendrecv");
    check_peer(from, "sendrecv");
    detail::rendezvous_state state;
    detail::envelope message;
    message.source = rank_;
    message.tag = tag;
    message.borrowed = out.data();
    message.borrowed_size = out.size();
    message.rendezvous = &state;
    // A dropped message is never posted: this side believes it sent, the peer times out.
    const bool posted = post(to, std::move(message), action);
    std::exception_ptr receive_error;
    try {
      receive(from, tag, "sendrecv", [&](detail::envelope& incoming) {
        check_size(incoming, from, tag, in_bytes);
        consume(incoming.payload());
      });
    } catch (...) {
      receive_error = std::current_exception();
    }
    if (posted) wait_rendezvous(to, tag, state, receive_error != nullptr);
    if (receive_error) std::rethrow_exception(receive_error);
  }

 private:
  [[nodiscard]] std::size_t link(int a, int b) const noexcept {
    return static_cast<std::size_t>(a) * static_cast<std::size_t>(world_->size) +
           static_cast<std::size_t>(b);
  }
  void check_peer(int peer, const char* what) const {
    if (peer < 0 || peer >= world_->size)
      fail(errc::out_of_range, cat("rank ", rank_, ": ", what, " with peer ", peer,
                                   " outside the world of ", world_->size, " ranks"));
  }
  void throw_if_aborted(int peer, tag_t tag, const char* what) const {
    if (world_->aborted.load())
      fail(errc::aborted, cat("rank ", rank_, ": ", what, " with peer ", peer, " (tag ", tag,
                              ") stopped because rank ", world_->first_failed_rank, " failed"));
  }

  /// What the fault plan does to one send (nothing, unless a fault selects it).
  struct send_action {
    bool drop = false, corrupt = false;
    double delay_seconds = 0;
    phase what = phase::any;  ///< the send's phase when checksums or a plan are on
  };

  send_action before_send(int peer, tag_t tag, std::span<const std::byte> bytes, const char* what) {
    check_peer(peer, what);
    throw_if_aborted(peer, tag, what);
    const std::uint64_t count = sends_.fetch_add(1, std::memory_order_relaxed) + 1;
    const auto& faults = world_->options.fail_on_send;
    if (static_cast<std::size_t>(rank_) < faults.size() && faults[rank_] != 0 &&
        count == faults[rank_])
      fail(errc::aborted, cat("rank ", rank_, ": injected fault on send ", count, " to peer ", peer,
                              " (tag ", tag, ")"));
    const auto& delays = world_->options.send_delay_seconds;
    if (static_cast<std::size_t>(rank_) < delays.size() && delays[rank_] > 0)
      std::this_thread::sleep_for(std::chrono::duration<double>(delays[rank_]));
    send_action action;
    if (!world_->checksums) return action;
    action.what = phase_of(world_->options.classify, tag, bytes);
    const auto& plan = world_->options.faults;
    for (std::size_t i = 0; i < plan.size(); ++i) {
      const fault& f = plan[i];
      if (f.rank != rank_ || (f.when != phase::any && f.when != action.what)) continue;
      if (world_->fault_matches[i].fetch_add(1, std::memory_order_relaxed) + 1 != f.nth) continue;
      world_->fault_fired[i].store(true);
      switch (f.kind) {
        case fault_kind::kill:
          fail(errc::aborted, cat("rank ", rank_, ": injected kill on send ", f.nth, " of ",
                                  describe_phase(action.what, tag), " to peer ", peer));
        case fault_kind::drop:
          action.drop = true;
          break;
        case fault_kind::corrupt:
          action.corrupt = true;
          break;
        case fault_kind::delay:
          action.delay_seconds += f.delay_seconds;
          break;
      }
    }
    return action;
  }

  /// Queues `message` in `peer`'s mailbox (after the link's delay); false when the fault plan
  /// dropped it. With checksums, the checksum is taken first, then an injected corruption
  /// flips a byte of the payload (of the checksum itself when the payload is empty), and the
  /// message gets the next sequence number of its (source, destination, tag) — a dropped one
  /// uses its number too, so the receiver of the next one sees the gap.
  bool post(int peer, detail::envelope message, const send_action& action) {
    if (world_->checksums) {
      message.checksum = fast_checksum(message.payload());
      message.what = action.what;
      if (action.corrupt) {
        if (message.borrows()) {
          message.owned.assign(message.borrowed, message.borrowed + message.borrowed_size);
          message.borrowed = nullptr;
          message.borrowed_size = 0;
        }
        if (message.owned.empty())
          message.checksum ^= 1;
        else
          message.owned[message.owned.size() / 2] ^= std::byte{0x10};
      }
    }
    const std::size_t size = message.size();
    auto& box = *world_->mailboxes[static_cast<std::size_t>(peer)];
    {
      std::lock_guard lock(box.mutex);
      if (world_->checksums) {
        message.sequence = ++box.sent_sequence[detail::mailbox::stream(rank_, message.tag)];
        if (action.drop) {  // its number is used: the receiver sees the gap
          world_->dropped.fetch_add(1);
          world_->dropped_by[static_cast<std::size_t>(rank_)].fetch_add(1);
          return false;
        }
      }
      message.ready = detail::clock::now();
      const link_model& model = world_->options.link;
      if (model.emulated() && peer != rank_) {
        const auto transfer =
            model.bandwidth_bytes_per_second > 0
                ? std::chrono::duration_cast<detail::clock::duration>(std::chrono::duration<double>(
                      static_cast<double>(size) / model.bandwidth_bytes_per_second))
                : detail::clock::duration{};
        detail::clock::time_point done;
        if (model.per_rank_nic) {
          // Sent on this rank's outgoing side, queued at the switch for the receiver's incoming
          // side (box.mutex, then nic_mutex: one order).
          std::lock_guard nic(world_->nic_mutex);
          auto& out = world_->nic_out_free[static_cast<std::size_t>(rank_)];
          auto& in = world_->nic_in_busy[static_cast<std::size_t>(peer)];
          const auto sending = std::max(message.ready, out);
          out = sending + transfer;
          std::erase_if(in, [&](const auto& busy) { return busy.second <= message.ready; });
          // The earliest gap of `transfer` on the incoming side from `sending` on: a message
          // posted later but sent earlier goes first, as at a switch port.
          auto start = sending;
          auto at = in.begin();
          for (; at != in.end(); ++at) {
            if (start + transfer <= at->first) break;
            start = std::max(start, at->second);
          }
          done = start + transfer;
          in.insert(at, {start, done});
        } else {
          auto& free_at = box.link_free[static_cast<std::size_t>(rank_)];
          done = std::max(message.ready, free_at) + transfer;
          free_at = done;
        }
        message.ready = done + std::chrono::duration_cast<detail::clock::duration>(
                                   std::chrono::duration<double>(model.latency_seconds));
      }
      if (action.delay_seconds > 0)
        message.ready += std::chrono::duration_cast<detail::clock::duration>(
            std::chrono::duration<double>(action.delay_seconds));
      box.queue.push_back(std::move(message));
      world_->link_bytes_sent[link(rank_, peer)].fetch_add(size, std::memory_order_relaxed);
      box.touch_and_wake();
    }
    return true;
  }

  /// Waits for a matching envelope (peer -1 = any), removes it from the queue and hands it to
  /// `consume` outside the lock (a rendezvous sender stays blocked until `done`).
  template <class Consume>
  void receive(int peer, tag_t tag, const char* what, Consume&& consume) {
    auto& box = *world_->mailboxes[static_cast<std::size_t>(rank_)];
    const double timeout = timeout_seconds();
    const auto timeout_ticks =
        std::chrono::duration_cast<detail::clock::duration>(std::chrono::duration<double>(timeout));
    const auto start = detail::clock::now();
    auto deadline = start + timeout_ticks;
    // A lost message stalls its receiver, and then, one by one, every rank that waits on a
    // stalled one. A rank whose peer waits in turn defers its timeout (up to one more
    // timeout), so the error names the receiver of the lost message, its sender and its phase
    // rather than a rank stalled in turn; with checksums a receiver knows when its peer sent
    // a message that never came, and reports at once.
    struct mark_waiting {
      std::atomic<std::uint64_t>* slot;
      ~mark_waiting() {
        if (slot != nullptr) slot->store(0);
      }
    } const waiting_guard{peer >= 0 ? &world_->waiting[static_cast<std::size_t>(rank_)] : nullptr};
    if (peer >= 0)
      world_->waiting[static_cast<std::size_t>(rank_)].store(detail::mailbox::stream(peer, tag) +
                                                             1);
    std::unique_lock lock(box.mutex);
    for (;;) {
      throw_if_aborted(peer, tag, what);
      auto found = std::find_if(box.queue.begin(), box.queue.end(), [&](const auto& m) {
        return m.tag == tag && (peer < 0 || m.source == peer);
      });
      if (found != box.queue.end()) {
        const auto now = detail::clock::now();
        if (found->ready <= now) {
          detail::envelope message = std::move(*found);
          box.queue.erase(found);
          std::uint64_t missing = 0;  // with checksums: the number of a message lost before it
          if (world_->checksums) {
            auto& taken = box.taken_sequence[detail::mailbox::stream(message.source, tag)];
            if (message.sequence != taken + 1) missing = taken + 1;
            taken = message.sequence;
          }
          if (message.rendezvous != nullptr)
            message.rendezvous->state = detail::rendezvous_state::phase::taken;
          lock.unlock();
          const int source = message.source;
          const std::size_t size = message.size();
          std::exception_ptr problem;
          try {
            if (missing != 0)
              fail(errc::bad_message,
                   cat("rank ", rank_, ": message ", missing, " from peer ", message.source, " in ",
                       describe_phase(phase_of_tag(tag), tag),
                       " never arrived (lost in flight: message ", message.sequence,
                       " of that peer and tag did); the link dropped it"));
            verify(message);
            consume(message);
          } catch (...) {
            problem = std::current_exception();
          }
          world_->link_bytes_received[link(rank_, source)].fetch_add(size,
                                                                     std::memory_order_relaxed);
          if (message.rendezvous != nullptr) {
            // The sender waits on this (the receiver's) mailbox until the phase is done; after
            // that it may free its buffer, so `message` must not be read past this point.
            lock.lock();
            message.rendezvous->state = detail::rendezvous_state::phase::done;
            box.touch_and_wake();
            lock.unlock();
          }
          if (problem) std::rethrow_exception(problem);
          return;
        }
        box.wait(lock, std::min(found->ready, deadline), world_->options.spin_seconds);
      } else {
        box.wait(lock, deadline, world_->options.spin_seconds);
      }
      if (const auto now = detail::clock::now(); now >= deadline) {
        throw_if_aborted(peer, tag, what);
        // Who reports a lost message: its receiver when it waits for it, else its sender
        // when it waits for the answer that never came; a rank stalled in turn defers.
        std::string cause;
        if (const std::uint64_t lost = peer >= 0 ? box.lost(peer, tag) : 0; lost != 0) {
          cause = cat("peer ", peer, " sent message ", lost,
                      " of this tag, which never arrived (lost in flight)");
          world_->loss_reported.store(true);  // its sender, waiting on this rank, defers
        } else if (peer >= 0 && world_->dropped_by[static_cast<std::size_t>(rank_)].load() > 0) {
          lock.unlock();
          std::pair<tag_t, std::uint64_t> mine{0, 0};
          {
            auto& theirs = *world_->mailboxes[static_cast<std::size_t>(peer)];
            std::lock_guard peer_lock(theirs.mutex);
            mine = theirs.lost_from(rank_);
          }
          lock.lock();
          // Its receiver reports it when it waits for that very message.
          const bool receiver_reports = world_->loss_reported.load() ||
                                        world_->waiting[static_cast<std::size_t>(peer)].load() ==
                                            detail::mailbox::stream(rank_, mine.first) + 1;
          if (mine.second != 0 && !receiver_reports)
            cause = cat("its own message ", mine.second, " to peer ", peer, " in ",
                        describe_phase(phase_of_tag(mine.first), mine.first),
                        " never arrived (lost in flight), so the peer could not answer");
        }
        if (cause.empty() && now < start + 2 * timeout_ticks &&
            (world_->dropped.load() > 0 || world_->waits(peer, rank_))) {
          deadline = now + std::chrono::milliseconds(20);
          continue;
        }
        fail(errc::timeout,
             cat("rank ", rank_, ": no message from ",
                 peer < 0 ? std::string("any peer") : cat("peer ", peer), " in ",
                 describe_phase(phase_of_tag(tag), tag), " within ", timeout, " s (", what,
                 " timed out); ",
                 !cause.empty() ? cause
                                : std::string("is that peer still running and sending with this "
                                              "tag? (raise world_options::timeout_seconds for slow "
                                              "steps)")));
      }
    }
  }

  /// The sender of a rendezvous waits until the receiver has copied its bytes. If it gives up
  /// (timeout, abort, failed receive) it withdraws a message nobody took yet, and otherwise
  /// waits for the copy in progress to finish so the receiver never reads freed memory.
  void wait_rendezvous(int peer, tag_t tag, detail::rendezvous_state& state, bool giving_up) {
    auto& box = *world_->mailboxes[static_cast<std::size_t>(peer)];
    const double timeout = timeout_seconds();
    const auto timeout_ticks =
        std::chrono::duration_cast<detail::clock::duration>(std::chrono::duration<double>(timeout));
    const auto start = detail::clock::now();
    auto deadline = start + timeout_ticks;
    std::unique_lock lock(box.mutex);
    using phase = detail::rendezvous_state::phase;
    for (;;) {
      if (state.state == phase::done) return;
      if (const auto now = detail::clock::now();
          !giving_up && now >= deadline && now < start + 2 * timeout_ticks &&
          (world_->waits(peer, rank_) || world_->dropped.load() > 0))
        deadline = now + std::chrono::milliseconds(20);  // a receiver reports (see receive())
      const bool stop = giving_up || world_->aborted.load() || detail::clock::now() >= deadline;
      if (stop && state.state == phase::posted) {
        auto mine = std::find_if(box.queue.begin(), box.queue.end(),
                                 [&](const auto& m) { return m.rendezvous == &state; });
        if (mine != box.queue.end()) box.queue.erase(mine);
        if (giving_up) return;
        throw_if_aborted(peer, tag, "sendrecv");
        fail(errc::timeout,
             cat("rank ", rank_, ": sendrecv to peer ", peer, " (tag ", tag, ") timed out after ",
                 timeout, " s waiting for the peer to receive; is it still running?"));
      }
      if (stop)
        box.wait(lock, detail::clock::now() + std::chrono::milliseconds(1), 0);
      else
        box.wait(lock, deadline, world_->options.spin_seconds);
    }
  }

  void check_size(const detail::envelope& message, int peer, tag_t tag,
                  std::size_t expected) const {
    if (message.size() != expected)
      fail(errc::size_mismatch, cat("rank ", rank_, ": message from peer ", peer, " (tag ", tag,
                                    ") has ", message.size(), " bytes but ", expected,
                                    " were expected; do both ranks pass the same length?"));
  }
  static void copy_payload(const detail::envelope& message, std::byte* destination) {
    if (message.size() == 0) return;
    std::memcpy(destination, message.payload().data(), message.size());
  }
  static void take_payload(detail::envelope& message, std::vector<std::byte>& out) {
    if (message.borrows())
      out.assign(message.borrowed, message.borrowed + message.borrowed_size);
    else
      out = std::move(message.owned);
  }
  /// With checksums: refuses a message whose bytes changed since its sender's checksum.
  void verify(const detail::envelope& message) const {
    if (!world_->checksums || fast_checksum(message.payload()) == message.checksum) return;
    fail(errc::bad_message,
         cat("rank ", rank_, ": message from peer ", message.source, " in ",
             describe_phase(message.what, message.tag), " failed its checksum (", message.size(),
             " bytes): it was changed in flight; the link or a peer's memory is damaged"));
  }

  detail::world_state* world_;
  int rank_;
  std::atomic<double> timeout_;
  std::atomic<std::uint64_t> sends_{0};  ///< atomic: one endpoint may serve several threads
};

/// N ranks as threads of one process. `run(fn)` calls `fn(thread_transport&)` on N threads
/// and returns when all finish; if one throws, the others are stopped (their blocking calls
/// raise `errc::aborted`) and run() rethrows the first error. Byte counters survive run().
class thread_world {
 public:
  explicit thread_world(int size, world_options options = {})
      : state_(std::make_unique<detail::world_state>(check_size(size), std::move(options))) {
    STRATA_EXPECTS(state_->options.timeout_seconds > 0,
                   "thread_world: timeout_seconds must be positive");
    STRATA_EXPECTS(state_->options.send_delay_seconds.empty() ||
                       state_->options.send_delay_seconds.size() == static_cast<std::size_t>(size),
                   "thread_world: send_delay_seconds needs one entry per rank (", size, ")");
    STRATA_EXPECTS(state_->options.fail_on_send.empty() ||
                       state_->options.fail_on_send.size() == static_cast<std::size_t>(size),
                   "thread_world: fail_on_send needs one entry per rank (", size, ")");
    STRATA_EXPECTS(state_->options.spin_seconds >= 0,
                   "thread_world: spin_seconds must be >= 0, got ", state_->options.spin_seconds);
    check_fault_plan(state_->options.faults, size);
  }

  [[nodiscard]] int size() const noexcept { return state_->size; }

  template <class Fn>
  requires std::invocable<Fn&, thread_transport&>
  void run(Fn&& fn) {
    {
      std::lock_guard lock(state_->abort_mutex);
      state_->first_error = nullptr;
      state_->first_failed_rank = -1;
    }
    state_->aborted.store(false);
    state_->dropped.store(0);
    state_->loss_reported.store(false);
    for (int r = 0; r < size(); ++r)
      state_->dropped_by[static_cast<std::size_t>(r)].store(0);
    for (auto& box : state_->mailboxes) {
      box->queue.clear();
      box->sent_sequence.clear();
      box->taken_sequence.clear();
    }
    for (std::size_t i = 0; i < state_->options.faults.size(); ++i) {
      state_->fault_matches[i].store(0);
      state_->fault_fired[i].store(false);
    }
    {
      std::vector<std::jthread> threads;
      threads.reserve(static_cast<std::size_t>(size()));
      for (int r = 0; r < size(); ++r) {
        threads.emplace_back([this, r, &fn] {
          thread_transport endpoint(*state_, r);
          try {
            fn(endpoint);
          } catch (...) {
            state_->abort(r, std::current_exception());
          }
        });
      }
    }
    if (state_->first_error) std::rethrow_exception(state_->first_error);
  }

  /// How many faults of the plan acted during the last run().
  [[nodiscard]] std::size_t faults_fired() const {
    std::size_t n = 0;
    for (std::size_t i = 0; i < state_->options.faults.size(); ++i)
      n += state_->fault_fired[i].load() ? 1 : 0;
    return n;
  }

  /// Payload bytes sent from `src` to `dst` over all runs so far.
  [[nodiscard]] std::uint64_t bytes_sent(int src, int dst) const {
    return state_
        ->link_bytes_sent[static_cast<std::size_t>(src) * static_cast<std::size_t>(size()) +
                          static_cast<std::size_t>(dst)]
        .load();
  }

 private:
  static int check_size(int size) {
    STRATA_EXPECTS(size >= 1, "thread_world: needs at least one rank, got ", size);
    return size;
  }
  std::unique_ptr<detail::world_state> state_;
};

static_assert(transport<thread_transport>);

}  // namespace strata::comm

/// @file fault.hpp
/// Fault rehearsal. `fault` is one entry of a fault plan: rank R's n-th send in a phase is
/// dropped, delayed, corrupted in flight, or R fails there (thread_world carries out a plan:
/// `world_options::faults`). `crash_after<T>` forwards every call to the wrapped endpoint of
/// any transport and ends the whole process (no clean-up, like a killed host) on its k-th send
/// (of a phase, optionally), so a multi-process job can practise losing a rank and resuming
/// from its last checkpoint.
#pragma once

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/comm/phase.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

/// What happens to the message a fault selects.
enum class fault_kind : std::uint8_t {
  drop,     ///< never delivered: its receiver times out (errc::timeout naming rank, peer,
            ///< phase), or finds the gap when that peer's next message of the tag arrives
            ///< (errc::bad_message: thread_world numbers messages when checksums are on)
  delay,    ///< delivered `delay_seconds` late (the run must end with the same model)
  corrupt,  ///< a byte flipped after the sender's checksum: the receiver refuses it
            ///< (errc::bad_message naming rank, peer, phase)
  kill,     ///< the sending rank fails there (errc::aborted naming rank, peer, phase)
};
inline constexpr std::array<std::string_view, 4> fault_kind_names = {"drop", "delay", "corrupt",
                                                                     "kill"};
[[nodiscard]] constexpr std::string_view fault_kind_name(fault_kind k) noexcept {
  return fault_kind_names[static_cast<std::size_t>(k)];
}

/// One fault of a plan: rank `rank`'s `nth` send (1-based) whose phase is `when` (`any`: every
/// send counts) is dropped, delayed, corrupted, or the rank fails on it.
struct fault {
  int rank = 0;
  fault_kind kind = fault_kind::kill;
  phase when = phase::any;
  std::uint64_t nth = 1;
  double delay_seconds = 0;  ///< `delay` only: how late the message arrives (> 0)

  /// "corrupt rank 1's 3rd send in phase 'push'".
  [[nodiscard]] std::string describe() const {
    return cat(fault_kind_name(kind), " rank ", rank, "'s send ", nth,
               when == phase::any ? std::string() : cat(" in phase '", phase_name(when), "'"),
               kind == fault_kind::delay ? cat(" by ", delay_seconds, " s") : std::string());
  }
};

/// Refuses (errc::invalid_argument) a plan that cannot be carried out in a world of `ranks`
/// ranks: a rank outside it, n = 0, a negative or non-finite delay, a delay fault without a
/// positive delay, or a delay on another kind.
inline void check_fault_plan(std::span<const fault> plan, int ranks) {
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const fault& f = plan[i];
    if (static_cast<std::size_t>(f.kind) >= fault_kind_names.size() ||
        static_cast<std::size_t>(f.when) >= phase_names.size())
      fail(errc::invalid_argument, cat("fault plan: fault ", i, " has an unknown kind or phase"));
    const auto where = [&] { return cat("fault plan: fault ", i, " (", f.describe(), ")"); };
    if (f.rank < 0 || f.rank >= ranks)
      fail(errc::invalid_argument,
           cat(where(), ": rank ", f.rank, " is outside the world of ", ranks, " ranks"));
    if (f.nth == 0)
      fail(errc::invalid_argument, cat(where(), ": n must be ≥ 1 (the n-th matching send)"));
    if (!std::isfinite(f.delay_seconds) || f.delay_seconds < 0)
      fail(errc::invalid_argument,
           cat(where(), ": delay must be finite and ≥ 0 s, got ", f.delay_seconds));
    if (f.kind == fault_kind::delay && f.delay_seconds == 0)
      fail(errc::invalid_argument, cat(where(), ": a delay fault needs delay_seconds > 0"));
    if (f.kind != fault_kind::delay && f.delay_seconds != 0)
      fail(errc::invalid_argument,
           cat(where(), ": delay_seconds is for delay faults only, got ", f.delay_seconds));
  }
}

/// Wraps a transport endpoint; models `transport`. `crash_on_send` = 0 never crashes; else
/// the process ends on the `crash_on_send`-th send whose phase is `when` (`any`: every send),
/// phases named by `classify` (nullptr: from the tag alone).
template <transport T>
class crash_after {
 public:
  crash_after(T& endpoint, std::uint64_t crash_on_send, phase when = phase::any,
              phase_classifier classify = nullptr)
      : endpoint_(&endpoint), crash_on_(crash_on_send), when_(when), classify_(classify) {}

  [[nodiscard]] int rank() const { return endpoint_->rank(); }
  [[nodiscard]] int size() const { return endpoint_->size(); }
  [[nodiscard]] double timeout_seconds() const { return endpoint_->timeout_seconds(); }
  [[nodiscard]] std::uint64_t bytes_sent_to(int peer) const {
    return endpoint_->bytes_sent_to(peer);
  }
  [[nodiscard]] std::uint64_t bytes_received_from(int peer) const {
    return endpoint_->bytes_received_from(peer);
  }
  void send(int peer, tag_t tag, std::span<const std::byte> bytes) {
    count_send(peer, tag, bytes);
    endpoint_->send(peer, tag, bytes);
  }
  void recv(int peer, tag_t tag, std::span<std::byte> bytes) { endpoint_->recv(peer, tag, bytes); }
  std::vector<std::byte> recv_message(int peer, tag_t tag) {
    return endpoint_->recv_message(peer, tag);
  }
  message recv_any(tag_t tag) { return endpoint_->recv_any(tag); }
  void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in,
                tag_t tag) {
    count_send(to, tag, out);
    endpoint_->sendrecv(to, out, from, in, tag);
  }

 private:
  void count_send(int peer, tag_t tag, std::span<const std::byte> bytes) {
    if (crash_on_ == 0) return;
    const phase p = phase_of(classify_, tag, bytes);
    if (when_ != phase::any && p != when_) return;
    if (++sends_ == crash_on_) {
      const std::string what = cat("rank ", rank(), ": injected crash on send ", crash_on_,
                                   when_ == phase::any ? "" : " of its phase", " (to peer ", peer,
                                   ", ", describe_phase(p, tag), ")\n");
      std::fputs(what.c_str(), stderr);
      std::fflush(stderr);
      std::_Exit(3);
    }
  }
  T* endpoint_;
  std::uint64_t crash_on_;
  phase when_;
  phase_classifier classify_;
  std::atomic<std::uint64_t> sends_{0};
};

}  // namespace strata::comm

/// @file fault.hpp
/// Fault rehearsal for any transport: `crash_after<T>` forwards every call to the wrapped
/// endpoint and ends the whole process (no clean-up, like a killed host) on its k-th send, so a
/// job can practise losing a rank and resuming from its last checkpoint. (thread_world has its
/// own, gentler injection: `world_options::fail_on_send` raises an error in the rank.)
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "strata/comm/concepts.hpp"

namespace strata::comm {

/// Wraps a transport endpoint; models `transport`. `crash_on_send` = 0 never crashes.
template <transport T>
class crash_after {
 public:
  crash_after(T& endpoint, std::uint64_t crash_on_send)
      : endpoint_(&endpoint), crash_on_(crash_on_send) {}

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
    count_send(peer, tag);
    endpoint_->send(peer, tag, bytes);
  }
  void recv(int peer, tag_t tag, std::span<std::byte> bytes) { endpoint_->recv(peer, tag, bytes); }
  std::vector<std::byte> recv_message(int peer, tag_t tag) {
    return endpoint_->recv_message(peer, tag);
  }
  message recv_any(tag_t tag) { return endpoint_->recv_any(tag); }
  void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in,
                tag_t tag) {
    count_send(to, tag);
    endpoint_->sendrecv(to, out, from, in, tag);
  }

 private:
  void count_send(int peer, tag_t tag) {
    if (crash_on_ != 0 && ++sends_ == crash_on_) {
      std::fprintf(stderr, "rank %d: injected crash on send %llu (to peer %d, tag %u)\n", rank(),
                   static_cast<unsigned long long>(crash_on_), peer, tag);
      std::fflush(stderr);
      std::_Exit(3);
    }
  }
  T* endpoint_;
  std::uint64_t crash_on_;
  std::atomic<std::uint64_t> sends_{0};
};

}  // namespace strata::comm

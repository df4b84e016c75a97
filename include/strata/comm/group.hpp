/// @file group.hpp
/// A sub-communicator: a subset of a transport's ranks seen as a transport of its own (ranks
/// renumbered 0..k-1), so collectives can run among the workers of a world that also holds
/// parameter-server ranks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

/// Views ranks `members` of `base` as a transport of `members.size()` ranks; this rank must be
/// a member. Byte counters and timeouts are the base transport's. Cheap; holds a reference.
template <transport Base>
class group {
 public:
  group(Base& base, std::vector<int> members) : base_(&base), members_(std::move(members)) {
    const auto mine = std::find(members_.begin(), members_.end(), base.rank());
    STRATA_EXPECTS(mine != members_.end(), "comm::group: rank ", base.rank(),
                   " is not a member of the group it uses");
    for (int member : members_)
      STRATA_EXPECTS(member >= 0 && member < base.size(), "comm::group: member ", member,
                     " outside the world of ", base.size(), " ranks");
    rank_ = static_cast<int>(mine - members_.begin());
  }

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return static_cast<int>(members_.size()); }
  /// The base transport's rank of group member `peer`.
  [[nodiscard]] int base_rank(int peer) const {
    STRATA_EXPECTS(peer >= 0 && peer < size(), "comm::group: peer ", peer, " outside the group of ",
                   size());
    return members_[static_cast<std::size_t>(peer)];
  }
  [[nodiscard]] double timeout_seconds() const { return base_->timeout_seconds(); }
  [[nodiscard]] std::uint64_t bytes_sent_to(int peer) const {
    return base_->bytes_sent_to(base_rank(peer));
  }
  [[nodiscard]] std::uint64_t bytes_received_from(int peer) const {
    return base_->bytes_received_from(base_rank(peer));
  }
  void send(int peer, tag_t tag, std::span<const std::byte> bytes) {
    base_->send(base_rank(peer), tag, bytes);
  }
  void recv(int peer, tag_t tag, std::span<std::byte> bytes) {
    base_->recv(base_rank(peer), tag, bytes);
  }
  std::vector<std::byte> recv_message(int peer, tag_t tag) {
    return base_->recv_message(base_rank(peer), tag);
  }
  /// Receives from any base rank; the source is renumbered (a non-member source is an error).
  message recv_any(tag_t tag) {
    message m = base_->recv_any(tag);
    const auto found = std::find(members_.begin(), members_.end(), m.source);
    if (found == members_.end())
      fail(errc::bad_message, cat("comm::group: message with tag ", tag, " from rank ", m.source,
                                  ", which is not in the group"));
    m.source = static_cast<int>(found - members_.begin());
    return m;
  }
  void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in,
                tag_t tag) {
    base_->sendrecv(base_rank(to), out, base_rank(from), in, tag);
  }
  /// Zero-copy receive, when the base transport offers it (see `consuming_transport`).
  template <class Consume>
  requires consuming_transport<Base>
  void sendrecv_consume(int to, std::span<const std::byte> out, int from, std::size_t in_bytes,
                        tag_t tag, Consume&& consume) {
    base_->sendrecv_consume(base_rank(to), out, base_rank(from), in_bytes, tag,
                            std::forward<Consume>(consume));
  }

 private:
  Base* base_;
  std::vector<int> members_;
  int rank_ = 0;
};

}  // namespace strata::comm

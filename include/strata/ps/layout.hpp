/// @file layout.hpp
/// Roles of the ranks of a parameter-server job: which ranks train (workers) and which hold
/// embedding shards (servers), dedicated or co-located.
#pragma once

#include <cstddef>
#include <string>

#include "strata/core/error.hpp"

namespace strata::ps {

/// How servers are placed on ranks.
enum class placement {
  dedicated,  ///< ranks [0, W) train, ranks [W, W + S) serve; transport size W + S
  colocated,  ///< every rank trains and serves one shard; W = S = transport size
};

/// W workers and S servers over a transport of `ranks()` ranks.
///
/// Worker index w runs on rank `worker_rank(w)`, server index s on rank `server_rank(s)`.
/// Value type; all members const and thread-safe; O(1).
class layout {
 public:
  /// Ranks [0, workers) train and ranks [workers, workers + servers) serve.
  static layout dedicated(int workers, int servers) {
    STRATA_EXPECTS(workers >= 1 && servers >= 1, "ps::layout::dedicated: needs at least one ",
                   "worker and one server, got ", workers, " workers and ", servers, " servers");
    return layout(placement::dedicated, workers, servers);
  }
  /// Every one of `ranks` ranks trains and serves one shard.
  static layout colocated(int ranks) {
    STRATA_EXPECTS(ranks >= 1, "ps::layout::colocated: needs at least one rank, got ", ranks);
    return layout(placement::colocated, ranks, ranks);
  }

  [[nodiscard]] placement kind() const noexcept { return kind_; }
  [[nodiscard]] int workers() const noexcept { return workers_; }
  [[nodiscard]] int servers() const noexcept { return servers_; }
  /// Transport size this layout needs.
  [[nodiscard]] int ranks() const noexcept {
    return kind_ == placement::dedicated ? workers_ + servers_ : workers_;
  }

  [[nodiscard]] bool is_worker(int rank) const noexcept { return rank >= 0 && rank < workers_; }
  [[nodiscard]] bool is_server(int rank) const noexcept {
    return kind_ == placement::dedicated ? rank >= workers_ && rank < workers_ + servers_
                                         : rank >= 0 && rank < servers_;
  }
  /// Rank of server index s in [0, servers()).
  [[nodiscard]] int server_rank(int s) const {
    check_index(s, servers_, "server");
    return kind_ == placement::dedicated ? workers_ + s : s;
  }
  /// Rank of worker index w in [0, workers()).
  [[nodiscard]] int worker_rank(int w) const {
    check_index(w, workers_, "worker");
    return w;
  }
  /// Worker index of a worker rank; `errc::invalid_argument` for a rank that does not train.
  [[nodiscard]] int worker_index(int rank) const {
    STRATA_EXPECTS(is_worker(rank), "ps::layout: rank ", rank, " is not a worker (", describe(),
                   ")");
    return rank;
  }
  /// Server index of a server rank; `errc::invalid_argument` for a rank that does not serve.
  [[nodiscard]] int server_index(int rank) const {
    STRATA_EXPECTS(is_server(rank), "ps::layout: rank ", rank, " is not a server (", describe(),
                   ")");
    return kind_ == placement::dedicated ? rank - workers_ : rank;
  }
  /// Raises `errc::size_mismatch` unless a transport of `transport_size` ranks fits.
  void check_size(int transport_size) const {
    if (transport_size != ranks())
      fail(errc::size_mismatch, cat("ps::layout: ", describe(), " needs a transport of ", ranks(),
                                    " ranks but it has ", transport_size));
  }
  /// "3 workers + 2 dedicated servers" / "4 co-located ranks".
  [[nodiscard]] std::string describe() const {
    return kind_ == placement::dedicated
               ? cat(workers_, " workers + ", servers_, " dedicated servers")
               : cat(workers_, " co-located ranks (each trains and serves)");
  }

 private:
  layout(placement kind, int workers, int servers)
      : kind_(kind), workers_(workers), servers_(servers) {}
  static void check_index(int i, int count, const char* what) {
    if (i < 0 || i >= count)
      fail(errc::out_of_range,
           cat("ps::layout: ", what, " index ", i, " outside [0, ", count, ")"));
  }

  placement kind_;
  int workers_;
  int servers_;
};

}  // namespace strata::ps

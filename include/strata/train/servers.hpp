/// @file servers.hpp
/// The parameter servers a trainer hosts in this process, and how a rank runs with them.
///
/// `hosted_servers<Server>` builds one `Server` (a `ps::server`) for each server rank of the
/// layout that runs here (every rank in a thread_world, this process's rank under MPI) and
/// gives the trainer what it needs of them without knowing the layout's details: run a rank
/// (serve, serve beside a worker, or only work), restart the step clocks between segments,
/// route checkpointed rows to the server that owns them, visit every row, report the load.
/// `split_traffic` turns a thread_world's link counters into the report's byte columns.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/core/error.hpp"
#include "strata/ps/client.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/server.hpp"
#include "strata/train/dense_path.hpp"
#include "strata/train/launch.hpp"
#include "strata/train/options.hpp"

namespace strata::train {

template <class Server>
class hosted_servers {
 public:
  hosted_servers() = default;  ///< no servers (strategies without a parameter server)

  /// The servers of `map` whose rank satisfies `runs_here(rank)`, under `rule`; table
  /// `dense_table` of the map is updated with `dense_optimizer`.
  template <class RunsHere>
  hosted_servers(const ps::shard_map& map, RunsHere&& runs_here, const ps::consistency_rule& rule,
                 typename Server::optimizer_type optimizer,
                 typename Server::dense_optimizer_type dense_optimizer, std::size_t dense_table,
                 ps::server_options options)
      : map_(map) {
    const auto& roles = map.roles();
    servers_.resize(static_cast<std::size_t>(roles.servers()));
    for (int s = 0; s < roles.servers(); ++s)
      if (runs_here(roles.server_rank(s)))
        servers_[static_cast<std::size_t>(s)] = std::make_unique<Server>(
            map, s, rule, optimizer, dense_optimizer, dense_table, options);
  }

  /// The server of rank `rank`, or nullptr (not a server rank, or not in this process).
  /// One `ps::in_process_reader` per server when every server lives in this process (else
  /// none): the client's pulls then read their rows directly (`ps::server::read_rows`, which
  /// waits at most `timeout_seconds` for the step to become servable).
  [[nodiscard]] std::vector<ps::in_process_reader> readers(double timeout_seconds) const {
    std::vector<ps::in_process_reader> out;
    for (const auto& server : servers_)
      if (!server) return {};
    for (const auto& server : servers_) {
      Server* at = server.get();
      out.emplace_back(
          [at, timeout_seconds](int worker, std::size_t table, std::uint64_t step,
                                std::span<const std::uint64_t> keys,
                                const std::function<void(std::size_t, const float*)>& sink) {
            at->read_rows(worker, table, step, keys, timeout_seconds, sink);
          });
    }
    return out;
  }
  [[nodiscard]] Server* at_rank(int rank) const {
    if (!map_ || !map_->roles().is_server(rank)) return nullptr;
    return servers_[static_cast<std::size_t>(map_->roles().server_index(rank))].get();
  }

  /// Runs rank t.rank()'s part of a segment: a dedicated server serves until every worker has
  /// shut down its client, a co-located one serves on a second thread beside `work`, any other
  /// rank runs `work`.
  template <comm::transport T, class Work>
  void run(T& t, Work&& work) {
    Server* server = at_rank(t.rank());
    if (server == nullptr) {
      work();
      return;
    }
    if (!map_->roles().is_worker(t.rank())) {
      server->serve(t);
      return;
    }
    run_beside([&] { server->serve(t); }, std::forward<Work>(work));
  }

  /// Restarts rank `rank`'s server's step clock (at a segment boundary).
  void reset_clock(int rank) {
    if (Server* server = at_rank(rank)) server->reset_clock();
  }

  /// Imports a checkpointed row into the server of rank `rank` when that server owns it (each
  /// rank loads its own share); returns whether it did.
  bool import_owned(int rank, std::size_t table, std::uint64_t key, std::span<const float> row,
                    std::span<const float> state) {
    Server* server = at_rank(rank);
    if (server == nullptr ||
        map_->server_of(table, key) != static_cast<std::size_t>(server->index()))
      return false;
    server->import_row(table, key, row, state);
    return true;
  }
  /// Imports a row into whichever server of this process owns it (none: skipped).
  void import_anywhere(std::size_t table, std::uint64_t key, std::span<const float> row,
                       std::span<const float> state) {
    const auto& owner = servers_[map_->server_of(table, key)];
    if (owner) owner->import_row(table, key, row, state);
  }

  /// The dense parameters `params`, cut into the rows of `layout`, as rows 0 … rows−1 of
  /// `table` with zero optimizer state (`state_floats` per row), into the servers of this
  /// process that own them.
  void import_dense(std::size_t table, const dense_rows& layout, std::span<const float> params,
                    std::size_t state_floats) {
    std::vector<float> row(layout.row());
    const std::vector<float> state(state_floats, 0.0f);
    for (std::size_t r = 0; r < layout.rows(); ++r) {
      layout.read(params, r, row);
      import_anywhere(table, r, row, state);
    }
  }

  /// fn(table, key, row, state) for every row of every server in this process.
  template <class Fn>
  void for_each_row(Fn&& fn) const {
    for (const auto& s : servers_)
      if (s) s->for_each_row(fn);
  }
  /// The load of every server in this process, in server order.
  [[nodiscard]] std::vector<ps::shard_stats> stats() const {
    std::vector<ps::shard_stats> result;
    for (const auto& s : servers_)
      if (s) result.push_back(s->stats());
    return result;
  }

 private:
  std::optional<ps::shard_map> map_;
  std::vector<std::unique_ptr<Server>> servers_;
};

/// The report's byte columns from a thread_world's link counters: PS requests and replies are
/// what the servers received and sent; the rest of the traffic is worker to worker (allreduce,
/// sparse exchange).
inline void split_traffic(const comm::thread_world& world, std::span<const ps::shard_stats> servers,
                          train_report& report) {
  std::uint64_t requests = 0, replies = 0, total = 0;
  for (const auto& st : servers) {
    requests += st.bytes_received;
    replies += st.bytes_sent;
  }
  for (int a = 0; a < world.size(); ++a)
    for (int b = 0; b < world.size(); ++b)
      if (a != b) total += world.bytes_sent(a, b);
  report.bytes_worker_to_server = requests;
  report.bytes_server_to_worker = replies;
  report.bytes_worker_to_worker = total >= requests + replies ? total - requests - replies : 0;
}

}  // namespace strata::train

/// @file sharded.hpp
/// `sharded<Optimizer, Consistency, Transport, PushCodec>`: embedding storage whose rows live
/// on parameter servers; gather = pull, apply_gradients = push.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <utility>

#include "strata/comm/concepts.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/compress/concepts.hpp"
#include "strata/compress/identity.hpp"
#include "strata/core/matrix.hpp"
#include "strata/embedding/concepts.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/ps/client.hpp"
#include "strata/ps/consistency.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/server.hpp"

namespace strata::embedding {

/// Embedding tables sharded over parameter servers, seen from one worker. Models `storage`.
///
/// - `gather(table, keys, out)` is `ps::client::pull` (one row per unique key travels).
/// - `apply_gradients(table, keys, grads)` is `ps::client::push`: duplicates summed on the
///   worker, the servers run `Optimizer` under `Consistency` (`server_type` is the matching
///   server to run on server ranks).
/// - `gather_tables(entries)` / `apply_gradients_tables(entries)`: the same for several tables
///   in one call — one pipelined round trip per step instead of one per table.
/// - `rebind_consistency<C>` is the same storage under another policy, so a trainer can pick
///   it.
/// Thread-safety: calls are serialised by an internal mutex (the client is single-threaded).
/// Cost: see `ps::client`.
template <optim::table_optimizer Optimizer, ps::consistency_choice Consistency = ps::sync,
          comm::transport Transport = comm::thread_transport,
          compress::compressor PushCodec = compress::identity>
class sharded {
 public:
  using optimizer_type = Optimizer;
  using consistency_type = Consistency;
  using transport_type = Transport;
  using client_type = ps::client<Consistency, Transport, PushCodec>;
  using server_type = ps::server<Optimizer, Consistency, PushCodec>;
  template <class C>
  using rebind_consistency = sharded<Optimizer, C, Transport, PushCodec>;

  /// A worker-side storage on rank `t.rank()` (a worker of `map`'s layout).
  sharded(Transport& t, ps::shard_map map, ps::client_options options = {},
          PushCodec codec = {}) requires ps::consistency<Consistency>
      : client_(t, std::move(map), options, std::move(codec)) {}
  /// As above, under `rule`: any rule with `Consistency = ps::run_time_rule`, else
  /// Consistency's own (`ps::client`).
  sharded(Transport& t, ps::shard_map map, const ps::consistency_rule& rule,
          ps::client_options options = {}, PushCodec codec = {})
      : client_(t, std::move(map), rule, options, std::move(codec)) {}

  [[nodiscard]] std::size_t table_count() const noexcept { return client_.map().table_count(); }
  [[nodiscard]] const table_spec& spec(std::size_t table) const {
    return client_.map().spec(table);
  }
  void gather(std::size_t table, std::span<const std::uint64_t> keys, matrix_view<float> out) {
    std::lock_guard lock(mutex_);
    client_.pull(table, keys, out);
  }
  void apply_gradients(std::size_t table, std::span<const std::uint64_t> keys,
                       matrix_view<const float> grads) {
    std::lock_guard lock(mutex_);
    client_.push(table, keys, grads);
  }
  /// Multi-table gather: `gather` of every entry, with one pipelined round trip for all of
  /// them (`ps::client::pull_tables`); bitwise the rows of one `gather` per entry. The tables
  /// must be distinct.
  void gather_tables(std::span<const ps::table_pull> entries) {
    std::lock_guard lock(mutex_);
    client_.pull_tables(entries);
  }
  /// Split-phase `gather_tables` (`ps::client::begin_pull_tables` / `finish_pull_tables`):
  /// the requests leave at `begin`, the rows land at `finish`. Under ps::async pushes may come
  /// in between (the pull may then miss them); under sync and bounded a push in between is
  /// refused, so begin the next step's pull after this step's push.
  void begin_gather_tables(std::span<const ps::table_pull> entries) {
    std::lock_guard lock(mutex_);
    client_.begin_pull_tables(entries);
  }
  void finish_gather_tables(std::span<const ps::table_pull> entries) {
    std::lock_guard lock(mutex_);
    client_.finish_pull_tables(entries);
  }
  /// Multi-table apply: `apply_gradients` of every entry, in order, all validated before any
  /// is sent (`ps::client::push_tables`). The tables must be distinct.
  void apply_gradients_tables(std::span<const ps::table_push> entries) {
    std::lock_guard lock(mutex_);
    client_.push_tables(entries);
  }
  /// Tells the servers this worker is done (call once at the end of training).
  void shutdown() {
    std::lock_guard lock(mutex_);
    client_.shutdown();
  }
  [[nodiscard]] client_type& client() noexcept { return client_; }

 private:
  std::mutex mutex_;
  client_type client_;
};

}  // namespace strata::embedding

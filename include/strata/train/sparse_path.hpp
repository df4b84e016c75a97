/// @file sparse_path.hpp
/// The sparse half of a Communicator: where a worker's embedding rows come from and where
/// their gradients go. Both paths take a step's rows as `ps::table_pull` / `ps::table_push`
/// entries (one per table, the same tables in the same order on every worker).
///
/// - `replicated_rows<Storage>` (`ring_allreduce`): every worker holds a replica of every
///   table. `apply` sums each worker's row gradients per key, all-gathers the sums, and every
///   replica applies all workers' sums in rank order, so replicas stay bitwise equal.
/// - `server_rows<Storage>` (`parameter_server`, `hybrid`): the tables live on the parameter
///   servers; `fetch` is one pipelined multi-table pull (or `begin_fetch` / `finish_fetch`, so
///   the next step's pull overlaps other work), `apply` one multi-table push. The client is
///   opened per training segment; error-feedback residuals of the pushes outlive it (and go
///   into checkpoints).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/optim/sparse_gradient.hpp"
#include "strata/ps/client.hpp"
#include "strata/ps/partition.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/detail/exchange.hpp"

namespace strata::train {

namespace detail {
/// Appends trivially copyable values to a byte blob / reads them back with bounds checks.
struct blob_writer {
  std::vector<std::byte>& out;
  template <class T>
  void put(std::span<const T> values) {
    const auto bytes = std::as_bytes(values);
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
  template <class T>
  void put_value(const T& v) {
    put(std::span<const T>(&v, 1));
  }
};
struct blob_reader {
  std::span<const std::byte> in;
  std::size_t at = 0;
  template <class T>
  std::span<const T> take(std::size_t count) {
    if ((in.size() - at) / sizeof(T) < count)
      fail(errc::bad_message, cat("sparse-gradient exchange message truncated at byte ", at, " of ",
                                  in.size(), " (wanted ", count, " values of ", sizeof(T),
                                  " bytes); do all workers push the same tables?"));
    const auto* first = reinterpret_cast<const T*>(in.data() + at);
    at += count * sizeof(T);
    return {first, count};
  }
};
}  // namespace detail

/// Sparse path of `ring_allreduce`: this worker's replica of every table (a local Storage such
/// as `embedding::local<Opt>` or `embedding::hash_table<Opt>`).
template <class Storage>
class replicated_rows {
 public:
  using storage_type = Storage;

  /// Builds the replica from the Storage's constructor arguments.
  template <class... Args>
  explicit replicated_rows(Args&&... storage_args)
      : storage_(std::forward<Args>(storage_args)...) {}

  /// The rows of every entry's keys, from the replica.
  void fetch(std::span<const ps::table_pull> pulls) {
    for (const auto& p : pulls)
      storage_.gather(p.table, p.keys, p.out);
  }

  /// Every worker's row gradients reach every replica: each worker sums its rows per key
  /// (first occurrence order), the sums are all-gathered, and each replica applies the
  /// concatenation in rank order. One worker applies its gradients in place (the same sums).
  template <comm::transport T>
  void apply(T& workers, std::span<const ps::table_push> pushes) {
    if (workers.size() == 1) {
      for (const auto& p : pushes)
        storage_.apply_gradients(p.table, p.keys, p.grads);
      return;
    }
    blob_.clear();
    detail::blob_writer out{blob_};
    for (const auto& p : pushes) {
      dedup_.sum_duplicates(p.keys, p.grads);
      out.put_value<std::uint64_t>(dedup_.size());
      out.put(dedup_.keys());
      const auto g = dedup_.grads();
      out.put(std::span<const float>(g.data(), g.rows() * g.cols()));
      // Keep the next table's 8-byte count and keys 8-byte aligned (an odd number of floats,
      // e.g. a dim-1 wide table, would misalign them).
      if ((g.rows() * g.cols()) % 2 != 0) out.put_value<float>(0.0f);
    }
    const auto all = detail::allgatherv(workers, blob_);
    readers_.clear();
    for (const auto& blob : all)
      readers_.push_back({blob});
    for (const auto& p : pushes) {
      const std::size_t dim = p.grads.cols();
      keys_.clear();
      grads_.clear();
      for (auto& r : readers_) {
        const auto count = r.template take<std::uint64_t>(1)[0];
        const auto k = r.template take<std::uint64_t>(count);
        const auto g = r.template take<float>(count * dim);
        if ((count * dim) % 2 != 0) (void)r.template take<float>(1);  // the writer's pad
        keys_.insert(keys_.end(), k.begin(), k.end());
        grads_.insert(grads_.end(), g.begin(), g.end());
      }
      storage_.apply_gradients(p.table, keys_,
                               matrix_view<const float>(grads_.data(), keys_.size(), dim));
    }
    for (std::size_t i = 0; i < readers_.size(); ++i)
      if (readers_[i].at != readers_[i].in.size())
        fail(errc::bad_message, cat("sparse-gradient exchange: worker ", i, " sent ",
                                    readers_[i].in.size() - readers_[i].at,
                                    " bytes beyond its tables; do all workers push the same "
                                    "tables?"));
  }

  // ---- checkpoint hooks: the replica's rows; no residual (row gradients travel lossless) ----

  /// Calls add(t, key, row, state) for every row of tables 0 … tables−1 of the replica.
  template <class Add>
  void save_rows(std::size_t tables, Add&& add) const {
    for (std::size_t t = 0; t < tables; ++t)
      storage_.for_each_row(t, [&](std::uint64_t key, std::span<const float> row,
                                   std::span<const float> state) { add(t, key, row, state); });
  }
  /// A checkpointed row (and its optimizer state) into the replica.
  void load_row(std::size_t table, std::uint64_t key, std::span<const float> row,
                std::span<const float> row_state) {
    auto target = storage_.row(table, key);
    auto target_state = storage_.state(table, key);
    STRATA_EXPECTS(row.size() == target.size() && row_state.size() == target_state.size(),
                   "replicated_rows::load_row: table ", table, " row of ", row.size(), " + ",
                   row_state.size(), " state values, the replica holds ", target.size(), " + ",
                   target_state.size());
    std::copy(row.begin(), row.end(), target.begin());
    std::copy(row_state.begin(), row_state.end(), target_state.begin());
  }
  void save_residual(checkpoint_writer& /*out*/) const {}
  void load_residual(const checkpoint_reader* /*saved*/, const ps::shard_map* /*map*/) {}

  [[nodiscard]] Storage& storage() noexcept { return storage_; }
  [[nodiscard]] const Storage& storage() const noexcept { return storage_; }

 private:
  Storage storage_;
  optim::sparse_gradient dedup_;
  std::vector<std::byte> blob_;
  std::vector<detail::blob_reader> readers_;
  std::vector<std::uint64_t> keys_;
  std::vector<float> grads_;
};

/// Error-feedback residuals of a worker's PS pushes as (table, key, values) records.
struct push_residuals {
  std::vector<std::uint64_t> tables, keys;
  std::vector<float> values;  ///< the rows' values, one after another (each its table's dim)
  void clear() {
    tables.clear();
    keys.clear();
    values.clear();
  }
};

/// Sparse path of `parameter_server` and `hybrid`: a PS client (Storage is an
/// `embedding::sharded<...>`), opened for each training segment. With `error_feedback` the
/// client's push residuals are kept between segments.
template <class Storage, bool error_feedback = false>
class server_rows {
 public:
  using storage_type = Storage;

  /// Opens the client on transport `t` (a worker of `map`'s layout) under `rule` and hands it
  /// the residuals kept from the previous segment.
  template <comm::transport T>
  void open(T& t, const ps::shard_map& map, const ps::consistency_rule& rule,
            ps::client_options options) {
    options.error_feedback = error_feedback;
    storage_.emplace(t, map, rule, options);
    if constexpr (error_feedback) {
      for (std::size_t i = 0, at = 0; i < residuals_.keys.size(); ++i) {
        const std::size_t dim = map.spec(residuals_.tables[i]).dim;
        storage_->client().restore_residual(
            residuals_.tables[i], residuals_.keys[i],
            std::span<const float>(residuals_.values.data() + at, dim));
        at += dim;
      }
    }
  }
  /// Keeps the client's residuals and tells the servers this worker is done.
  void close() {
    if constexpr (error_feedback) {
      residuals_.clear();
      storage().client().for_each_residual(
          [&](std::size_t table, std::uint64_t key, std::span<const float> values) {
            residuals_.tables.push_back(table);
            residuals_.keys.push_back(key);
            residuals_.values.insert(residuals_.values.end(), values.begin(), values.end());
          });
    }
    storage().shutdown();
    storage_.reset();
  }
  [[nodiscard]] bool is_open() const noexcept { return storage_.has_value(); }

  /// Every entry's rows in one pipelined round trip.
  void fetch(std::span<const ps::table_pull> pulls) { storage().gather_tables(pulls); }
  /// Split phase: the pull leaves at `begin_fetch` and its rows land at `finish_fetch`. Under
  /// ps::async the next step's pull may leave before this step computes and pushes (the
  /// trainer's `prefetches()`: its rows may miss this worker's push, the staleness async
  /// allows); under sync and bounded it leaves right after this step's push (a push while it
  /// is in flight is refused) and its rows are bitwise those of a blocking `fetch` there.
  void begin_fetch(std::span<const ps::table_pull> pulls) { storage().begin_gather_tables(pulls); }
  void finish_fetch(std::span<const ps::table_pull> pulls) {
    storage().finish_gather_tables(pulls);
  }
  /// Every entry's gradients in one push (the servers sum the workers' pushes).
  template <comm::transport T>
  void apply(T& /*workers*/, std::span<const ps::table_push> pushes) {
    storage().apply_gradients_tables(pushes);
  }

  [[nodiscard]] Storage& storage() {
    STRATA_EXPECTS(storage_.has_value(), "server_rows: the client is not open (call open first)");
    return *storage_;
  }
  // ---- checkpoint hooks: the rows are the servers'; a worker keeps its push residuals ----

  /// The push residuals kept between segments as sections push/tables, push/keys and
  /// push/values (nothing without error feedback).
  void save_residual(checkpoint_writer& out) const {
    if constexpr (error_feedback) {
      out.add_values<std::uint64_t>("push/tables", residuals_.tables);
      out.add_values<std::uint64_t>("push/keys", residuals_.keys);
      out.add_values<float>("push/values", residuals_.values);
    }
  }
  /// The push residuals from a worker's checkpoint file (`saved` null or without them: none),
  /// checked against `map`'s tables; the next `open` hands them to the client.
  void load_residual(const checkpoint_reader* saved, const ps::shard_map* map) {
    if constexpr (error_feedback) {
      residuals_.clear();
      if (saved == nullptr || !saved->has("push/keys")) return;
      STRATA_EXPECTS(map != nullptr, "server_rows::load_residual: no shard map to check against");
      residuals_.tables = saved->values<std::uint64_t>("push/tables");
      residuals_.keys = saved->values<std::uint64_t>("push/keys", residuals_.tables.size());
      std::size_t floats = 0;
      for (auto t : residuals_.tables) {
        if (t >= map->table_count())
          fail(errc::corrupt_data,
               cat("checkpoint ", saved->path().string(), ": residual of table ", t,
                   " outside the ", map->table_count(), " tables"));
        floats += map->spec(t).dim;
      }
      residuals_.values = saved->values<float>("push/values", floats);
    }
  }

  /// The residuals kept between segments (empty without error feedback), for checkpoints.
  [[nodiscard]] push_residuals& residuals() noexcept { return residuals_; }
  [[nodiscard]] const push_residuals& residuals() const noexcept { return residuals_; }

 private:
  std::optional<Storage> storage_;
  push_residuals residuals_;
};

}  // namespace strata::train

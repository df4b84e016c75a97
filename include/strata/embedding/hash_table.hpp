/// @file hash_table.hpp
/// `hash_table<Optimizer>`: embedding tables keyed by any 64-bit id, rows created on first
/// touch.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/core/row_store.hpp"
#include "strata/embedding/concepts.hpp"
#include "strata/embedding/detail/rows.hpp"
#include "strata/embedding/init.hpp"
#include "strata/embedding/pooled.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/optim/sparse_gradient.hpp"

namespace strata::embedding {

/// Embedding tables with no fixed vocabulary: any 64-bit key, collision-free (open addressing
/// on the full key with linear probing; the index doubles when 70% full). A row is created on
/// first touch — by `gather` as well as by `apply_gradients` — with the same `uniform_init`
/// values of (seed, table, key) that `local` and parameter-server shards use, and zero
/// optimizer state; so for the same calls it trains exactly like `local`.
///
/// A spec with `rows > 0` additionally bounds keys to [0, rows) (same check and message as
/// `local`); `rows == 0` accepts every key.
///
/// Layout: each table is a `row_store` (the store of parameter-server stripes too): an index of
/// 4-byte entries (load 35–70%), a row → key array (8 B/row), and rows of weights followed by
/// their optimizer state in fixed 1024-row chunks (rows never move, so spans from `row`/`state`
/// stay valid while the table grows). Memory per row ≈ 4·(dim + state_floats) + 8 + 4/load
/// bytes (`memory_bytes`). Measured by bench_embedding (SGD, 10^6 random 64-bit keys): 80.8
/// B/row at dim 16 (local: 64 B/row) and 272.9 B/row at dim 64 (local: 256 B/row); the index
/// and keys are 16.8 of them (a 2^21-entry index: 10^6 keys are just past a doubling).
/// Cost: gather is one probe per key, apply one per unique key (`row_store::resolve`: parallel
/// lookups, serial insertion of new keys, parallel row init; then parallel copy/update);
/// `apply_pooled_gradients` takes a pooled lookup's d_out directly (no per-key rows), as `local`'s
/// does. Thread-safety: as `local` — calls on different tables may run concurrently, calls on one
/// table must be serialised (gather inserts rows).
template <optim::table_optimizer Optimizer>
class hash_table {
 public:
  using optimizer_type = Optimizer;
  /// Rows per arena chunk.
  static constexpr std::size_t chunk_rows = row_store::chunk_rows;

  /// Throws `errc::invalid_argument` for a spec with dim == 0.
  explicit hash_table(std::vector<table_spec> specs, Optimizer optimizer = {},
                      uniform_init init = {})
      : optimizer_(optimizer), init_(init) {
    tables_.reserve(specs.size());
    for (std::size_t t = 0; t < specs.size(); ++t) {
      STRATA_EXPECTS(specs[t].dim > 0, "hash_table: table ", t, " '", specs[t].name,
                     "' has dim == 0");
      const std::size_t dim = specs[t].dim;
      tables_.push_back(table{std::move(specs[t]), row_store(dim, Optimizer::state_floats(dim))});
    }
  }

  [[nodiscard]] std::size_t table_count() const noexcept { return tables_.size(); }
  [[nodiscard]] const table_spec& spec(std::size_t t) const {
    return checked(t, "hash_table::spec").spec;
  }
  [[nodiscard]] const Optimizer& optimizer() const noexcept { return optimizer_; }
  [[nodiscard]] const uniform_init& initializer() const noexcept { return init_; }

  /// out.row(i) ← row keys[i] of table t, creating (initialising) rows of unseen keys.
  /// Throws `errc::size_mismatch` unless out is keys.size() × dim; `errc::out_of_range` for a
  /// bad table, or a key ≥ rows when the spec has rows > 0.
  void gather(std::size_t t, std::span<const std::uint64_t> keys, matrix_view<float> out) {
    table& tab = checked(t, "hash_table::gather");
    detail::check_shape("hash_table::gather", "out", t, tab.spec, out.rows(), keys.size(),
                        out.cols());
    detail::check_keys("hash_table::gather", t, tab.spec, keys);
    resolve(t, tab, keys);
    detail::gather_rows(out, [&](std::size_t i) { return weights_of(tab, tab.found[i]); });
  }

  /// Sums duplicate keys (in input order) and applies the optimizer once per touched row
  /// (creating unseen rows first, in ascending key order). Validates everything before changing
  /// anything. Cost: O(n) grouping plus an O(u log u) sort of the u unique keys
  /// (`optim::key_groups`), one probe per unique key, one fused sum-and-update pass
  /// (`optim::apply_grouped`, tbb-parallel when large).
  void apply_gradients(std::size_t t, std::span<const std::uint64_t> keys,
                       matrix_view<const float> grads) {
    table& tab = checked(t, "hash_table::apply_gradients");
    detail::check_shape("hash_table::apply_gradients", "grads", t, tab.spec, grads.rows(),
                        keys.size(), grads.cols());
    detail::check_keys("hash_table::apply_gradients", t, tab.spec, keys);
    tab.groups.group(keys, optim::group_order::ascending_key);
    update(t, tab, grads);
  }

  /// Backward of a pooled lookup fused with the update, as `local::apply_pooled_gradients`:
  /// bitwise equal to `unpool` followed by `apply_gradients`, without the per-key rows.
  void apply_pooled_gradients(std::size_t t, std::span<const std::uint64_t> keys,
                              std::span<const std::uint64_t> offsets, pooling mode,
                              matrix_view<const float> d_out) {
    table& tab = checked(t, "hash_table::apply_pooled_gradients");
    detail::check_pooled_gradients("hash_table::apply_pooled_gradients", t, tab.spec, keys, offsets,
                                   d_out);
    detail::check_keys("hash_table::apply_pooled_gradients", t, tab.spec, keys);
    tab.groups.group_bags(keys, offsets, optim::group_order::ascending_key);
    update(t, tab, detail::bag_gradients(d_out, offsets, mode, tab.scaled));
  }

  /// Whether row `key` of table t exists (never creates it).
  [[nodiscard]] bool contains(std::size_t t, std::uint64_t key) const {
    return checked(t, "hash_table::contains").rows.find(key) != row_store::npos;
  }
  /// Number of rows created in table t.
  [[nodiscard]] std::size_t size(std::size_t t) const {
    return checked(t, "hash_table::size").rows.size();
  }
  /// Weights of row `key` of table t, creating the row if needed (e.g. to load a checkpoint).
  [[nodiscard]] std::span<float> row(std::size_t t, std::uint64_t key) {
    return ref_of(checked(t, "hash_table::row"), find_or_create(t, key)).weights;
  }
  /// Weights of an existing row; throws `errc::out_of_range` when the key has no row.
  [[nodiscard]] std::span<const float> row(std::size_t t, std::uint64_t key) const {
    return const_cast<hash_table&>(*this).ref_of(existing(t, key, "hash_table::row")).weights;
  }
  /// Optimizer state of row `key` of table t, creating the row if needed.
  [[nodiscard]] std::span<float> state(std::size_t t, std::uint64_t key) {
    return ref_of(checked(t, "hash_table::state"), find_or_create(t, key)).state;
  }
  [[nodiscard]] std::span<const float> state(std::size_t t, std::uint64_t key) const {
    return const_cast<hash_table&>(*this).ref_of(existing(t, key, "hash_table::state")).state;
  }

  /// Calls `fn(key, weights, state)` for every row of table t in creation order (sort the keys
  /// if an order independent of history is needed).
  template <class Fn>
  void for_each_row(std::size_t t, Fn&& fn) const {
    checked(t, "hash_table::for_each_row").rows.for_each(fn);
  }

  /// Bytes held by table t: index slots, row → key array and allocated arena chunks.
  [[nodiscard]] std::size_t memory_bytes(std::size_t t) const {
    return checked(t, "hash_table::memory_bytes").rows.bytes();
  }

 private:
  struct table {
    table_spec spec;
    row_store rows;                      // key → row (weights, then optimizer state)
    optim::key_groups groups{};          // reusable grouping workspace
    std::vector<float> scaled{};         // d_out rows × 1/len for pooling::mean
    std::vector<std::uint64_t> found{};  // row of each key of the current call
  };

  /// Creates the rows of unseen grouped keys (ascending), then sums rows.row(member) per group
  /// and applies the optimizer to the group's row.
  void update(std::size_t t, table& tab, matrix_view<const float> rows) {
    resolve(t, tab, tab.groups.keys());
    const float* src = rows.data();
    const std::size_t stride = rows.stride();
    optim::with_table(optimizer_, t, [&](const auto& opt) {
      optim::apply_grouped(
          opt, tab.groups, tab.spec.dim,
          [src, stride](std::uint32_t m) { return src + m * stride; },
          [&tab](std::size_t g) { return ref_of(tab, tab.found[g]); });
    });
  }

  /// tab.found[i] ← row of keys[i], creating and initialising rows of unseen keys.
  void resolve(std::size_t t, table& tab, std::span<const std::uint64_t> keys) {
    tab.found.resize(keys.size());
    tab.rows.resolve(keys, tab.found, init_, t);
  }

  std::uint64_t find_or_create(std::size_t t, std::uint64_t key) {
    table& tab = checked(t, "hash_table::row");
    detail::check_keys("hash_table::row", t, tab.spec, std::span<const std::uint64_t>(&key, 1));
    return tab.rows.find_or_create(key, init_, t).first;
  }

  std::pair<table*, std::uint64_t> existing(std::size_t t, std::uint64_t key,
                                            const char* who) const {
    const table& tab = checked(t, who);
    const std::uint64_t r = tab.rows.find(key);
    if (r == row_store::npos)
      fail(errc::out_of_range,
           cat(who, ": key ", key, " has no row in table ", t, " '", tab.spec.name,
               "'; use contains() first or the non-const "
               "overload, which creates the row"));
    return {const_cast<table*>(&tab), r};
  }
  optim::row_ref ref_of(std::pair<table*, std::uint64_t> at) noexcept {
    return ref_of(*at.first, at.second);
  }
  static optim::row_ref ref_of(table& tab, std::uint64_t r) noexcept {
    // Built from the row's pointer, not by copying row_store::row's spans: GCC then spills the
    // spans and reloads them whole (a failed store-to-load forward per row, ~25% of Adagrad's
    // update time at dim 16).
    float* p = tab.rows.data(r);
    const std::size_t dim = tab.rows.dim();
    return {{p, dim}, {p + dim, tab.rows.state_floats()}};
  }
  static const float* weights_of(const table& tab, std::uint64_t r) noexcept {
    return tab.rows.data(r);
  }

  const table& checked(std::size_t t, const char* who) const {
    detail::check_table(who, t, tables_.size());
    return tables_[t];
  }
  table& checked(std::size_t t, const char* who) {
    detail::check_table(who, t, tables_.size());
    return tables_[t];
  }

  std::vector<table> tables_;
  Optimizer optimizer_;
  uniform_init init_;
};

}  // namespace strata::embedding

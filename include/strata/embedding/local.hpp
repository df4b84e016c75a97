/// @file local.hpp
/// `local<Optimizer>`: dense embedding tables held in this process.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/embedding/concepts.hpp"
#include "strata/embedding/detail/rows.hpp"
#include "strata/embedding/init.hpp"
#include "strata/embedding/pooled.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/optim/sparse_gradient.hpp"

namespace strata::embedding {

/// Dense embedding tables in this process: table t is a `rows × dim` float array (key = row
/// index, keys must be < rows) plus a `rows × Optimizer::state_floats(dim)` state array. Rows
/// start at `uniform_init` values of (seed, t, key); state starts at zero.
///
/// - `gather`: bounds-checked copy of the keys' rows (prefetching, tbb-parallel when large).
/// - `apply_gradients`: sums the gradient rows of each key in their original order and applies
///   the optimizer once per touched row — deterministic and bitwise equal to what
///   `hash_table` and parameter-server shards compute.
/// - `apply_pooled_gradients`: the same from the output gradient of a pooled lookup
///   (`pooled_lookup::backward` uses it), without materialising one gradient row per key.
/// Memory: exactly `4 · (dim + state_floats(dim))` bytes per row (`memory_bytes()`).
/// Thread-safety: calls on different tables may run concurrently; calls on one table must be
/// serialised by the caller (gather alone may run concurrently with other gathers).
///
/// ```cpp
/// local<optim::adagrad> tables({{"user", 1000, 16}, {"item", 500, 16}}, {.lr = 0.05f});
/// tables.gather(0, keys, rows);             // rows: keys.size() × 16
/// tables.apply_gradients(0, keys, grads);   // grads: keys.size() × 16
/// tables.apply_pooled_gradients(0, keys, offsets, pooling::sum, d_out);  // d_out: bags × 16
/// ```
template <optim::table_optimizer Optimizer>
class local {
 public:
  using optimizer_type = Optimizer;

  /// Builds and initialises every table (in parallel over rows). Throws
  /// `errc::invalid_argument` for a spec with rows == 0 or dim == 0.
  explicit local(std::vector<table_spec> specs, Optimizer optimizer = {}, uniform_init init = {})
      : optimizer_(optimizer), init_(init) {
    tables_.reserve(specs.size());
    for (std::size_t t = 0; t < specs.size(); ++t) {
      auto& spec = specs[t];
      STRATA_EXPECTS(spec.rows > 0, "local: table ", t, " '", spec.name,
                     "' has rows == 0 (no fixed vocabulary); use hash_table storage for it");
      STRATA_EXPECTS(spec.dim > 0, "local: table ", t, " '", spec.name, "' has dim == 0");
      const std::size_t dim = spec.dim;
      const std::size_t state = Optimizer::state_floats(dim);
      const std::uint64_t rows = spec.rows;
      table tab{std::move(spec),
                aligned_buffer<float>(rows * dim),
                aligned_buffer<float>(rows * state),
                state,
                {},
                {},
                {}};
      float* weights = tab.weights.data();
      tbb::parallel_for(tbb::blocked_range<std::uint64_t>(0, tab.spec.rows, 4096),
                        [&](const tbb::blocked_range<std::uint64_t>& r) {
                          for (std::uint64_t k = r.begin(); k < r.end(); ++k)
                            init_.fill(t, k, {weights + k * dim, dim});
                        });
      tables_.push_back(std::move(tab));
    }
  }

  [[nodiscard]] std::size_t table_count() const noexcept { return tables_.size(); }
  [[nodiscard]] const table_spec& spec(std::size_t t) const {
    detail::check_table("local::spec", t, tables_.size());
    return tables_[t].spec;
  }
  [[nodiscard]] const Optimizer& optimizer() const noexcept { return optimizer_; }
  [[nodiscard]] const uniform_init& initializer() const noexcept { return init_; }

  /// out.row(i) ← row keys[i] of table t. Throws `errc::out_of_range` for a bad table or key
  /// (naming table, key and range), `errc::size_mismatch` unless out is keys.size() × dim.
  void gather(std::size_t t, std::span<const std::uint64_t> keys, matrix_view<float> out) const {
    const table& tab = checked(t, "local::gather");
    detail::check_shape("local::gather", "out", t, tab.spec, out.rows(), keys.size(), out.cols());
    detail::check_keys("local::gather", t, tab.spec, keys);
    const float* base = tab.weights.data();
    const std::size_t dim = tab.spec.dim;
    detail::gather_rows(out, [&](std::size_t i) { return base + keys[i] * dim; });
  }

  /// Applies dLoss/d(row keys[i]) = grads.row(i): duplicates summed (in input order),
  /// optimizer applied once per touched row. Validates everything before changing anything.
  /// Cost: O(n) grouping (`optim::key_groups`) and one fused sum-and-update pass
  /// (`optim::apply_grouped`); no summed-gradient buffer.
  void apply_gradients(std::size_t t, std::span<const std::uint64_t> keys,
                       matrix_view<const float> grads) {
    table& tab = checked(t, "local::apply_gradients");
    detail::check_shape("local::apply_gradients", "grads", t, tab.spec, grads.rows(), keys.size(),
                        grads.cols());
    const float* src = grads.data();
    const std::size_t stride = grads.stride();
    update(
        t, tab, keys, "local::apply_gradients",
        [&](optim::key_groups& groups, optim::key_share share) {
          groups.group(keys, optim::group_order::first_seen, share);
        },
        [src, stride](std::uint32_t i) { return src + i * stride; });
  }

  /// Backward of a pooled lookup fused with the update: the gradient of row k is
  /// Σ d_out.row(b) · s_b over the positions of k in the bags (s_b = 1 for sum, 1/len(b) for
  /// mean), summed in input order, and the optimizer is applied once per touched row.
  /// Bitwise equal to `unpool` followed by `apply_gradients`, without the keys.size() × dim
  /// per-key rows: d_out rows are summed straight into a register accumulator per unique key.
  /// Throws `errc::invalid_argument` for bad offsets, `errc::size_mismatch` unless d_out is
  /// bags × dim, `errc::out_of_range` for a bad table or key; validates everything before
  /// changing anything. Cost: O(n) grouping plus one pass over the unique rows (prefetched);
  /// tbb-parallel over keys only when the work is large.
  void apply_pooled_gradients(std::size_t t, std::span<const std::uint64_t> keys,
                              std::span<const std::uint64_t> offsets, pooling mode,
                              matrix_view<const float> d_out) {
    table& tab = checked(t, "local::apply_pooled_gradients");
    detail::check_pooled_gradients("local::apply_pooled_gradients", t, tab.spec, keys, offsets,
                                   d_out);
    const matrix_view<const float> rows = detail::bag_gradients(d_out, offsets, mode, tab.scaled);
    const float* src = rows.data();
    const std::size_t stride = rows.stride();
    update(
        t, tab, keys, "local::apply_pooled_gradients",
        [&](optim::key_groups& groups, optim::key_share share) {
          groups.group_bags(keys, offsets, optim::group_order::first_seen, share);
        },
        [src, stride](std::uint32_t b) { return src + b * stride; });
  }

  /// Weights of row `key` of table t (for checkpoints and tests). Bounds-checked.
  [[nodiscard]] std::span<float> row(std::size_t t, std::uint64_t key) {
    return row_ref_of(checked_key(t, key, "local::row"), key).weights;
  }
  [[nodiscard]] std::span<const float> row(std::size_t t, std::uint64_t key) const {
    return const_cast<local&>(*this).row(t, key);
  }
  /// Optimizer state of row `key` of table t (state_floats(dim) values). Bounds-checked.
  [[nodiscard]] std::span<float> state(std::size_t t, std::uint64_t key) {
    return row_ref_of(checked_key(t, key, "local::state"), key).state;
  }
  [[nodiscard]] std::span<const float> state(std::size_t t, std::uint64_t key) const {
    return const_cast<local&>(*this).state(t, key);
  }
  /// The whole weight array of table t as rows × dim.
  [[nodiscard]] matrix_view<const float> weights(std::size_t t) const {
    const table& tab = checked(t, "local::weights");
    return {tab.weights.data(), tab.spec.rows, tab.spec.dim};
  }

  /// Calls `fn(key, weights, state)` for every row of table t in ascending key order.
  template <class Fn>
  void for_each_row(std::size_t t, Fn&& fn) const {
    const table& tab = checked(t, "local::for_each_row");
    const std::size_t dim = tab.spec.dim;
    for (std::uint64_t k = 0; k < tab.spec.rows; ++k)
      fn(k, std::span<const float>(tab.weights.data() + k * dim, dim),
         std::span<const float>(tab.state.data() + k * tab.state_floats, tab.state_floats));
  }

  /// Bytes held by table t's weights and state (excluding small per-call workspaces).
  [[nodiscard]] std::size_t memory_bytes(std::size_t t) const {
    const table& tab = checked(t, "local::memory_bytes");
    return (tab.weights.size() + tab.state.size()) * sizeof(float);
  }

 private:
  struct table {
    table_spec spec;
    aligned_buffer<float> weights;
    aligned_buffer<float> state;
    std::size_t state_floats = 0;
    optim::key_groups groups;               // grouping workspace (serial updates)
    std::vector<optim::key_groups> shares;  // one per key share (parallel updates)
    std::vector<float> scaled;              // d_out rows × 1/len for pooling::mean
  };

  /// Groups the keys (`group(key_groups&, key_share)`), checks them, then sums row_of(member)
  /// per unique key and applies the optimizer to its row. Large updates (≥ ~256 K floats of
  /// work) with more than one thread are split by key hash into shares that are grouped, then
  /// applied, in parallel (one task per share); the rows are the same either way. Keys are
  /// checked before any row changes.
  template <class Group, class RowOf>
  void update(std::size_t t, table& tab, std::span<const std::uint64_t> keys, const char* who,
              const Group& group, const RowOf& row_of) {
    const std::size_t dim = tab.spec.dim;
    const std::size_t work = keys.size() * (dim + tab.state_floats);
    const std::size_t shares = std::min({optim::detail::usable_threads(), std::size_t{64},
                                         work / (optim::detail::grouped_parallel_floats / 4)});
    if (shares < 2 || work < optim::detail::grouped_parallel_floats) {
      group(tab.groups, optim::key_share{});
      if (tab.groups.max_key() >= tab.spec.rows)  // nothing changed yet: name the bad key
        detail::check_keys(who, t, tab.spec, keys);
      optim::with_table(optimizer_, t, [&](const auto& opt) {
        optim::apply_grouped(
            opt, tab.groups, dim, row_of,
            [&tab](std::size_t g) { return row_ref_of(tab, tab.groups.key(g)); },
            optim::parallelism::serial);
      });
      return;
    }
    if (tab.shares.size() < shares) tab.shares.resize(shares);
    const auto each_share = [&](const auto& body) {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, shares, 1),
          [&](const tbb::blocked_range<std::size_t>& r) {
            for (std::size_t p = r.begin(); p < r.end(); ++p)
              body(p, tab.shares[p]);
          },
          tbb::simple_partitioner{});
    };
    each_share([&](std::size_t p, optim::key_groups& groups) {
      group(groups, optim::key_share{p, shares});
    });
    if (tab.shares[0].max_key() >= tab.spec.rows) detail::check_keys(who, t, tab.spec, keys);
    optim::with_table(optimizer_, t, [&](const auto& opt) {
      each_share([&](std::size_t, optim::key_groups& groups) {
        optim::apply_grouped(
            opt, groups, dim, row_of,
            [&tab, &groups](std::size_t g) { return row_ref_of(tab, groups.key(g)); },
            optim::parallelism::serial);
      });
    });
  }

  const table& checked(std::size_t t, const char* who) const {
    detail::check_table(who, t, tables_.size());
    return tables_[t];
  }
  table& checked(std::size_t t, const char* who) {
    detail::check_table(who, t, tables_.size());
    return tables_[t];
  }
  table& checked_key(std::size_t t, std::uint64_t key, const char* who) {
    table& tab = checked(t, who);
    detail::check_keys(who, t, tab.spec, std::span<const std::uint64_t>(&key, 1));
    return tab;
  }
  static optim::row_ref row_ref_of(table& tab, std::uint64_t key) noexcept {
    const std::size_t dim = tab.spec.dim;
    return {{tab.weights.data() + key * dim, dim},
            {tab.state.data() + key * tab.state_floats, tab.state_floats}};
  }

  std::vector<table> tables_;
  Optimizer optimizer_;
  uniform_init init_;
};

}  // namespace strata::embedding

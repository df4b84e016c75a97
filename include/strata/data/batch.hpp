/// @file batch.hpp
/// CTR batches (dense features, hashed sparse keys, labels) and an in-memory columnar dataset
/// that gathers batches by example index (an `example_source`: every epoch a permutation of all
/// examples, sharded_sampler.hpp).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/data/sampler.hpp"
#include "strata/data/source.hpp"

namespace strata::data {

/// Number of integer (dense) columns in a Criteo line.
inline constexpr std::size_t criteo_dense_columns = 13;
/// Number of categorical (sparse) columns in a Criteo line.
inline constexpr std::size_t criteo_sparse_columns = 26;

/// One batch of CTR examples. Row i of `dense` (B × dense_cols, already transformed, e.g.
/// log(1 + x) with missing → 0), row i of `keys` (B × sparse_cols, key of feature f already in
/// [0, table_rows[f])) and `labels[i]` (0 or 1) describe example i.
/// Value type; not thread-safe for concurrent mutation.
struct ctr_batch {
  matrix<float> dense;
  matrix<std::uint64_t> keys;
  std::vector<float> labels;

  /// Number of examples.
  [[nodiscard]] std::size_t size() const noexcept { return labels.size(); }
  [[nodiscard]] bool empty() const noexcept { return labels.empty(); }

  /// Makes room for `rows` examples of the given widths. Allocates only when the shape changes
  /// (so a batch reused for equal-size batches never allocates); contents are unspecified after
  /// a shape change (zero) and kept otherwise.
  void resize(std::size_t rows, std::size_t dense_cols = criteo_dense_columns,
              std::size_t sparse_cols = criteo_sparse_columns) {
    if (dense.rows() != rows || dense.cols() != dense_cols) dense = matrix<float>(rows, dense_cols);
    if (keys.rows() != rows || keys.cols() != sparse_cols)
      keys = matrix<std::uint64_t>(rows, sparse_cols);
    labels.resize(rows);
  }
};

/// An in-memory store of CTR examples, one contiguous array per field kind (dense values,
/// keys, labels; example-major within each). Appends are amortised O(row width); `gather`
/// costs O(indices × row width). Const members are safe to call from many threads at once;
/// appends are not. As an `example_source`, each epoch is a permutation of every example
/// (`sharded_sampler`: the order depends on (seed, epoch) only); it holds n indices per loader.
class ctr_dataset final : public example_source {
 public:
  explicit ctr_dataset(std::size_t dense_cols = criteo_dense_columns,
                       std::size_t sparse_cols = criteo_sparse_columns)
      : dense_cols_(dense_cols), sparse_cols_(sparse_cols) {}

  [[nodiscard]] std::size_t size() const noexcept override { return labels_.size(); }
  [[nodiscard]] bool empty() const noexcept { return labels_.empty(); }
  [[nodiscard]] std::size_t dense_cols() const noexcept override { return dense_cols_; }
  [[nodiscard]] std::size_t sparse_cols() const noexcept override { return sparse_cols_; }

  void reserve(std::size_t examples) {
    dense_.reserve(examples * dense_cols_);
    keys_.reserve(examples * sparse_cols_);
    labels_.reserve(examples);
  }

  /// Appends one example.
  void append(std::span<const float> dense, std::span<const std::uint64_t> keys, float label) {
    STRATA_EXPECTS(dense.size() == dense_cols_ && keys.size() == sparse_cols_,
                   "ctr_dataset::append: example has ", dense.size(), " dense and ", keys.size(),
                   " sparse values; the dataset holds ", dense_cols_, " and ", sparse_cols_);
    dense_.insert(dense_.end(), dense.begin(), dense.end());
    keys_.insert(keys_.end(), keys.begin(), keys.end());
    labels_.push_back(label);
  }

  /// Appends every example of `batch`.
  void append(const ctr_batch& batch) {
    STRATA_EXPECTS(batch.dense.cols() == dense_cols_ && batch.keys.cols() == sparse_cols_ &&
                       batch.dense.rows() == batch.size() && batch.keys.rows() == batch.size(),
                   "ctr_dataset::append: batch is ", batch.dense.rows(), " x ", batch.dense.cols(),
                   " dense, ", batch.keys.rows(), " x ", batch.keys.cols(), " keys, ", batch.size(),
                   " labels; the dataset holds rows of ", dense_cols_, " dense and ", sparse_cols_,
                   " sparse values");
    dense_.insert(dense_.end(), batch.dense.flat().begin(), batch.dense.flat().end());
    keys_.insert(keys_.end(), batch.keys.flat().begin(), batch.keys.flat().end());
    labels_.insert(labels_.end(), batch.labels.begin(), batch.labels.end());
  }

  /// `out` ← examples `indices` (in that order; repeats allowed). Reuses `out`'s memory when
  /// its shape already matches. An index ≥ size() raises `errc::out_of_range`.
  void gather(std::span<const std::size_t> indices, ctr_batch& out) const override {
    for (std::size_t i = 0; i < indices.size(); ++i)
      if (indices[i] >= size())
        fail(errc::out_of_range, cat("ctr_dataset::gather: index ", indices[i], " (position ", i,
                                     ") is outside the dataset of ", size(), " examples"));
    out.resize(indices.size(), dense_cols_, sparse_cols_);
    for (std::size_t i = 0; i < indices.size(); ++i) {
      const std::size_t e = indices[i];
      std::copy_n(dense_.data() + e * dense_cols_, dense_cols_, out.dense.row(i).data());
      std::copy_n(keys_.data() + e * sparse_cols_, sparse_cols_, out.keys.row(i).data());
      out.labels[i] = labels_[e];
    }
  }
  /// Examples `indices` as a new batch.
  [[nodiscard]] ctr_batch gather(std::span<const std::size_t> indices) const {
    ctr_batch out;
    gather(indices, out);
    return out;
  }

  /// All dense values (size() × dense_cols()).
  [[nodiscard]] matrix_view<const float> dense() const noexcept {
    return {dense_.data(), size(), dense_cols_};
  }
  /// All keys (size() × sparse_cols()).
  [[nodiscard]] matrix_view<const std::uint64_t> keys() const noexcept {
    return {keys_.data(), size(), sparse_cols_};
  }
  /// All labels.
  [[nodiscard]] std::span<const float> labels() const noexcept { return labels_; }

  [[nodiscard]] std::size_t steps_per_epoch(const loader_config& config) const override {
    return config.global_batch == 0 ? 0 : size() / config.global_batch;
  }
  [[nodiscard]] std::unique_ptr<batch_loader> loader(const loader_config& config) const override {
    return std::make_unique<permuted_loader>(*this, config);
  }

 private:
  /// A rank's sharded_sampler over the whole dataset.
  class permuted_loader final : public batch_loader {
   public:
    permuted_loader(const ctr_dataset& set, const loader_config& c)
        : set_(set), sampler_(set.size(), c.world_size, c.rank, c.global_batch, c.seed) {}
    [[nodiscard]] std::size_t steps_per_epoch() const override {
      return sampler_.steps_per_epoch();
    }
    void load(std::size_t step, ctr_batch& out) override {
      const std::size_t per_epoch = sampler_.steps_per_epoch();
      if (sampler_.epoch() != step / per_epoch) sampler_.set_epoch(step / per_epoch);
      set_.gather(sampler_.batch(step % per_epoch), out);
    }

   private:
    const ctr_dataset& set_;
    sharded_sampler sampler_;
  };

  std::size_t dense_cols_;
  std::size_t sparse_cols_;
  std::vector<float> dense_;
  std::vector<std::uint64_t> keys_;
  std::vector<float> labels_;
};

}  // namespace strata::data

/// @file source.hpp
/// Where training examples come from: `example_source` (a set of CTR examples that can be
/// gathered by index and hands each rank a `batch_loader`), implemented by the in-memory
/// `ctr_dataset` (batch.hpp) and by memory-mapped converted files (`ctr_files`, ctr_binary.hpp).
///
/// The trainer takes an `example_source&`: one abstract interface rather than a template
/// parameter, because a source is consulted once per batch (a virtual call there costs
/// nothing) while a template parameter would compile the whole trainer once more per source.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

namespace strata::data {

struct ctr_batch;

/// Who reads batches, and how a training run walks the examples.
struct loader_config {
  std::size_t world_size = 1;    ///< data-parallel workers
  std::size_t rank = 0;          ///< this worker, in [0, world_size)
  std::size_t global_batch = 1;  ///< examples per step over all workers (a multiple of world_size)
  std::uint64_t seed = 0;        ///< with the epoch, fixes every epoch's order
  /// Sources that shard their examples (ctr_files): how many shards each epoch's examples are
  /// dealt into (0: one per worker). The example order depends on (seed, epoch, data_shards),
  /// never on world_size: runs with equal data_shards see the same global batches at any worker
  /// count that divides it. Ignored by sources that permute all examples (ctr_dataset).
  std::size_t data_shards = 0;
  /// Sources that read a window at a time (ctr_files): examples shuffled together (0: the
  /// source's default). Resident memory grows with it, shuffle quality too.
  std::size_t shuffle_window = 0;
};

/// One rank's walk over a source: `load(step, out)` fills `out` with this rank's
/// global_batch / world_size examples of global step `step` (epoch step / steps_per_epoch();
/// steps of an epoch in any order, epochs in increasing order are cheapest). The global batch
/// of a step is the same whatever world_size (rank r holds its r-th slice). Not thread-safe:
/// one loader per rank thread.
class batch_loader {
 public:
  virtual ~batch_loader() = default;
  [[nodiscard]] virtual std::size_t steps_per_epoch() const = 0;
  virtual void load(std::size_t step, ctr_batch& out) = 0;
};

/// A set of CTR examples. Const members are safe from many threads at once.
class example_source {
 public:
  virtual ~example_source() = default;
  [[nodiscard]] virtual std::size_t size() const = 0;         ///< examples
  [[nodiscard]] virtual std::size_t dense_cols() const = 0;   ///< dense values per example
  [[nodiscard]] virtual std::size_t sparse_cols() const = 0;  ///< keys per example
  /// `out` ← examples `indices` (any order, repeats allowed); an index ≥ size() raises
  /// `errc::out_of_range`. For evaluation and tests; training reads through loaders.
  virtual void gather(std::span<const std::size_t> indices, ctr_batch& out) const = 0;
  /// A hint after reading examples [first, end) in order: they will not be needed soon (a
  /// mapped source drops their pages from the resident set). Default: nothing.
  virtual void done_with(std::size_t /*first*/, std::size_t /*end*/) const {}
  /// Steps in one epoch for `config` (the same for every epoch and rank).
  [[nodiscard]] virtual std::size_t steps_per_epoch(const loader_config& config) const = 0;
  /// A loader for `config.rank`; the source must outlive it.
  [[nodiscard]] virtual std::unique_ptr<batch_loader> loader(const loader_config& config) const = 0;
};

}  // namespace strata::data

/// @file sampler.hpp
/// Deterministic, epoch-reshuffled sharding of example indices over data-parallel workers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/rng.hpp"

namespace strata::data {

/// Splits each epoch's examples over `world_size` workers in global batches of `global_batch`.
///
/// Epoch e uses the permutation `perm` = `strata::shuffle(0 … n−1, counter_rng{seed, e})`.
/// Step t's global batch is perm[t·G, (t+1)·G); rank r gets its contiguous slice
/// perm[t·G + r·G/W, t·G + (r+1)·G/W). Hence one worker with global batch G sees exactly the
/// union of what W workers see at every step (in the same order, rank after rank), ranks are
/// disjoint, and an epoch visits every example at most once.
///
/// The last partial global batch is dropped (`steps_per_epoch() = n / G`): every step has
/// exactly G examples on all ranks, so synchronous steps never wait on a missing batch; the
/// n mod G dropped examples differ from epoch to epoch since each epoch reshuffles.
///
/// Cost: `set_epoch` O(n) time, one n-entry permutation held per sampler; `batch` O(1).
/// Not thread-safe for concurrent `set_epoch`; const members are.
class sharded_sampler {
 public:
  sharded_sampler(std::size_t dataset_size, std::size_t world_size, std::size_t rank,
                  std::size_t global_batch, std::uint64_t seed)
      : n_(dataset_size), world_(world_size), rank_(rank), global_(global_batch), seed_(seed) {
    STRATA_EXPECTS(world_size > 0, "sharded_sampler: world_size must be positive");
    STRATA_EXPECTS(rank < world_size, "sharded_sampler: rank ", rank, " outside world of ",
                   world_size);
    STRATA_EXPECTS(global_batch > 0 && global_batch % world_size == 0,
                   "sharded_sampler: global batch ", global_batch,
                   " must be a positive multiple of world_size ", world_size,
                   " so every rank gets the same batch size");
    STRATA_EXPECTS(global_batch <= dataset_size, "sharded_sampler: global batch ", global_batch,
                   " is larger than the dataset (", dataset_size,
                   " examples); an epoch would have no step");
    perm_.resize(n_);
    set_epoch(0);
  }

  /// Reshuffles for epoch `e` (deterministic in (seed, e)).
  void set_epoch(std::uint64_t e) {
    epoch_ = e;
    std::iota(perm_.begin(), perm_.end(), std::size_t{0});
    shuffle(std::span(perm_), counter_rng{seed_, e});
  }

  [[nodiscard]] std::uint64_t epoch() const noexcept { return epoch_; }
  [[nodiscard]] std::size_t steps_per_epoch() const noexcept { return n_ / global_; }
  [[nodiscard]] std::size_t global_batch() const noexcept { return global_; }
  /// Examples per rank and step: global_batch / world_size.
  [[nodiscard]] std::size_t local_batch() const noexcept { return global_ / world_; }
  [[nodiscard]] std::size_t world_size() const noexcept { return world_; }
  [[nodiscard]] std::size_t rank() const noexcept { return rank_; }
  [[nodiscard]] std::size_t dataset_size() const noexcept { return n_; }

  /// This rank's example indices for step `step` of the current epoch.
  [[nodiscard]] std::span<const std::size_t> batch(std::size_t step) const {
    return global_indices(step).subspan(rank_ * local_batch(), local_batch());
  }
  /// Every rank's indices for step `step` (rank 0's slice first).
  [[nodiscard]] std::span<const std::size_t> global_indices(std::size_t step) const {
    if (step >= steps_per_epoch())
      fail(errc::out_of_range,
           cat("sharded_sampler: step ", step, " outside epoch of ", steps_per_epoch(), " steps (",
               n_, " examples / global batch ", global_, ")"));
    return std::span<const std::size_t>(perm_).subspan(step * global_, global_);
  }
  /// The whole permutation of the current epoch.
  [[nodiscard]] std::span<const std::size_t> permutation() const noexcept { return perm_; }

 private:
  std::size_t n_, world_, rank_, global_;
  std::uint64_t seed_;
  std::uint64_t epoch_ = 0;
  std::vector<std::size_t> perm_;
};

}  // namespace strata::data

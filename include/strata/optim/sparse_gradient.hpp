/// @file sparse_gradient.hpp
/// Sparse gradients of embedding rows: summing the rows of duplicate keys in a deterministic
/// order (`sparse_gradient`, `sum_duplicates`) and applying a sparse optimizer to the unique
/// rows (`apply_sparse`), in parallel over rows when the update is large.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/optim/concepts.hpp"

namespace strata::optim {

/// One embedding row and its optimizer state, as handed to an optimizer's `apply`.
struct row_ref {
  std::span<float> weights;
  std::span<float> state;
};

namespace detail {
/// Below this many floats of work a loop stays on the calling thread.
inline constexpr std::size_t parallel_floats = std::size_t{1} << 15;
}  // namespace detail

/// Reusable workspace that turns (keys, one gradient row per key) into (unique keys ascending,
/// one summed gradient row per unique key).
///
/// Determinism: rows of equal keys are summed in their original order (first occurrence copied,
/// the others added one by one), whatever the thread count, so results are bitwise
/// reproducible. Method: keys are grouped with an open-addressing hash (O(n)), only the u
/// unique keys are sorted (O(u log u)), a stable counting sort lists each key's rows in input
/// order (O(n)), then each unique row is summed (tbb-parallel over keys when large). Already
/// strictly ascending keys skip the grouping. Buffers grow to the largest call seen and are
/// reused, so steady-state calls do not allocate. Not thread-safe: one workspace per thread.
class sparse_gradient {
 public:
  /// Sums the rows of `grads` (keys.size() × dim) that share a key. Throws
  /// `errc::size_mismatch` when grads.rows() != keys.size(). The result stays valid until the
  /// next call.
  void sum_duplicates(std::span<const std::uint64_t> keys, matrix_view<const float> grads) {
    if (grads.rows() != keys.size())
      fail(errc::size_mismatch, cat("sum_duplicates: ", keys.size(), " keys but ", grads.rows(),
                                    " gradient rows; pass exactly one gradient row per key"));
    const std::size_t n = keys.size();
    dim_ = grads.cols();
    order_.resize(n);
    starts_.resize(n + 1);
    const bool strictly_ascending =
        std::adjacent_find(keys.begin(), keys.end(), std::greater_equal<>{}) == keys.end();
    if (strictly_ascending) {
      keys_.assign(keys.begin(), keys.end());
      for (std::size_t i = 0; i <= n; ++i) {
        if (i < n) order_[i] = i;
        starts_[i] = i;
      }
    } else {
      group(keys);
    }
    const std::size_t unique = keys_.size();
    values_.resize(unique * dim_);

    const auto sum_groups = [&](std::size_t first, std::size_t last) {
      switch (dim_) {
        case 8:
          return sum_range<8>(grads, first, last);
        case 16:
          return sum_range<16>(grads, first, last);
        case 32:
          return sum_range<32>(grads, first, last);
        case 64:
          return sum_range<64>(grads, first, last);
        case 128:
          return sum_range<128>(grads, first, last);
        default:
          return sum_range<0>(grads, first, last);
      }
    };
    if (n * dim_ < detail::parallel_floats) {
      sum_groups(0, unique);
    } else {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, unique, 64),
          [&](const tbb::blocked_range<std::size_t>& r) { sum_groups(r.begin(), r.end()); });
    }
  }

  /// Unique keys, strictly ascending.
  [[nodiscard]] std::span<const std::uint64_t> keys() const noexcept { return keys_; }
  /// Summed gradient rows: row g belongs to keys()[g] (size() × dim()).
  [[nodiscard]] matrix_view<const float> grads() const noexcept {
    return {values_.data(), keys_.size(), dim_, dim_};
  }
  /// The same rows, writable (e.g. to scale or compress them in place).
  [[nodiscard]] matrix_view<float> grads() noexcept {
    return {values_.data(), keys_.size(), dim_, dim_};
  }
  /// Number of unique keys.
  [[nodiscard]] std::size_t size() const noexcept { return keys_.size(); }
  /// Gradient row width.
  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  /// How many input rows were summed into unique row g.
  [[nodiscard]] std::size_t count(std::size_t g) const noexcept {
    return starts_[g + 1] - starts_[g];
  }

 private:
  static constexpr std::uint32_t empty = ~std::uint32_t{0};

  /// Sums groups [first, last). `Dim` > 0 fixes the row width at compile time so the running
  /// sum stays in registers; 0 reads it at run time. Same order of additions either way.
  template <std::size_t Dim>
  void sum_range(matrix_view<const float> grads, std::size_t first, std::size_t last) {
    const std::size_t dim = Dim > 0 ? Dim : dim_;
    for (std::size_t g = first; g < last; ++g) {
      float* out = values_.data() + g * dim;
      float acc[Dim > 0 ? Dim : 1];
      float* sum = Dim > 0 ? acc : out;
      const float* lead = grads.row(order_[starts_[g]]).data();
      std::copy(lead, lead + dim, sum);
      for (std::size_t i = starts_[g] + 1; i < starts_[g + 1]; ++i) {
        const float* in = grads.row(order_[i]).data();
        for (std::size_t c = 0; c < dim; ++c)
          sum[c] += in[c];
      }
      if constexpr (Dim > 0) std::copy(acc, acc + Dim, out);
    }
  }

  /// Fills keys_ (unique, ascending), starts_ and order_ (input rows grouped by key, input
  /// order within a key) for unsorted keys.
  void group(std::span<const std::uint64_t> keys) {
    const std::size_t n = keys.size();
    if (n >= empty) fail(errc::invalid_argument, cat("sum_duplicates: ", n, " keys exceed 2^32"));
    std::size_t capacity = 16;
    while (capacity < 2 * n)
      capacity *= 2;
    slot_keys_.resize(capacity);
    slot_groups_.assign(capacity, empty);
    group_of_.resize(n);
    keys_.clear();
    const std::size_t mask = capacity - 1;
    for (std::size_t i = 0; i < n; ++i) {  // group id = order of first occurrence
      const std::uint64_t key = keys[i];
      std::size_t s = hash(key) & mask;
      while (slot_groups_[s] != empty && slot_keys_[s] != key)
        s = (s + 1) & mask;
      if (slot_groups_[s] == empty) {
        slot_keys_[s] = key;
        slot_groups_[s] = static_cast<std::uint32_t>(keys_.size());
        keys_.push_back(key);
      }
      group_of_[i] = slot_groups_[s];
    }
    const std::size_t unique = keys_.size();
    // rank_[g]: position of group g's key in ascending order.
    by_key_.resize(unique);
    for (std::size_t g = 0; g < unique; ++g)
      by_key_[g] = static_cast<std::uint32_t>(g);
    std::sort(by_key_.begin(), by_key_.end(),
              [&](std::uint32_t a, std::uint32_t b) { return keys_[a] < keys_[b]; });
    rank_.resize(unique);
    sorted_keys_.resize(unique);
    for (std::size_t r = 0; r < unique; ++r) {
      rank_[by_key_[r]] = static_cast<std::uint32_t>(r);
      sorted_keys_[r] = keys_[by_key_[r]];
    }
    keys_.swap(sorted_keys_);
    // Stable counting sort of the input rows by rank.
    std::fill(starts_.begin(), starts_.begin() + static_cast<std::ptrdiff_t>(unique) + 1, 0);
    for (std::size_t i = 0; i < n; ++i)
      ++starts_[rank_[group_of_[i]] + 1];
    for (std::size_t r = 0; r < unique; ++r)
      starts_[r + 1] += starts_[r];
    cursor_.assign(starts_.begin(), starts_.begin() + static_cast<std::ptrdiff_t>(unique));
    for (std::size_t i = 0; i < n; ++i)
      order_[cursor_[rank_[group_of_[i]]]++] = i;
    starts_.resize(unique + 1);
  }

  static std::uint64_t hash(std::uint64_t key) noexcept {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return key;
  }

  std::vector<std::size_t> order_;   // input rows grouped by key
  std::vector<std::size_t> starts_;  // group g is order_[starts_[g] .. starts_[g + 1])
  std::vector<std::uint64_t> keys_;
  std::vector<float> values_;
  std::size_t dim_ = 0;
  // grouping scratch
  std::vector<std::uint64_t> slot_keys_;
  std::vector<std::uint32_t> slot_groups_;
  std::vector<std::uint32_t> group_of_;
  std::vector<std::uint32_t> by_key_;
  std::vector<std::uint32_t> rank_;
  std::vector<std::uint64_t> sorted_keys_;
  std::vector<std::size_t> cursor_;
};

/// Owning result of the free `sum_duplicates`.
struct summed_gradient {
  std::vector<std::uint64_t> keys;  ///< unique keys, strictly ascending
  matrix<float> grads;              ///< keys.size() × dim summed rows
};

/// One-shot form of `sparse_gradient::sum_duplicates` (allocates its result; use a
/// `sparse_gradient` workspace in loops).
inline summed_gradient sum_duplicates(std::span<const std::uint64_t> keys,
                                      matrix_view<const float> grads) {
  sparse_gradient work;
  work.sum_duplicates(keys, grads);
  summed_gradient out{{work.keys().begin(), work.keys().end()},
                      matrix<float>(work.size(), work.dim())};
  const auto summed = work.grads();
  for (std::size_t g = 0; g < work.size(); ++g)
    std::copy(summed.row(g).begin(), summed.row(g).end(), out.grads.row(g).begin());
  return out;
}

/// Applies `opt` to unique rows: for each i in [0, grads.rows()), `locate(i)` returns the
/// `row_ref` of the i-th row and `opt.apply(row.weights, row.state, grads.row(i))` updates it.
///
/// Rows must be distinct (sum duplicates first); then updates are independent and run in
/// parallel with tbb::parallel_for once the work exceeds ~32 K floats, so `locate` must be safe
/// to call concurrently for distinct i (a read-only lookup). Throws `errc::size_mismatch` when
/// a located row is not grads.cols() wide or its state is smaller than
/// `O::state_floats(dim)`.
template <sparse_optimizer O, class Locate>
void apply_sparse(const O& opt, matrix_view<const float> grads, Locate&& locate) {
  const std::size_t dim = grads.cols();
  const std::size_t state = O::state_floats(dim);
  const auto body = [&](std::size_t first, std::size_t last) {
    for (std::size_t i = first; i < last; ++i) {
      const row_ref row = locate(i);
      if (row.weights.size() != dim || row.state.size() < state) [[unlikely]]
        fail(errc::size_mismatch,
             cat("apply_sparse(", O::name, "): row ", i, " has ", row.weights.size(),
                 " weights and ", row.state.size(), " state floats, expected ", dim, " and ", state,
                 "; the gradient width must equal the table dim"));
      opt.apply(row.weights, row.state.first(state), grads.row(i));
    }
  };
  const std::size_t n = grads.rows();
  if (n * (dim + state) < detail::parallel_floats) {
    body(0, n);
  } else {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 32),
                      [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); });
  }
}

}  // namespace strata::optim

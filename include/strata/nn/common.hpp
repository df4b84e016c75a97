/// @file common.hpp
/// What every nn layer shares: Eigen maps over strata's row-major views, the deterministic
/// row-block parallel loop, reusable scratch matrices and shape checks with clear errors.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"

namespace strata::nn {

/// Batches with at least this many rows are split over oneTBB threads; smaller ones run on
/// the calling thread (splitting them costs more than it saves).
inline constexpr std::size_t parallel_min_rows = 64;
/// Rows per parallel task. Fixed (never derived from the thread count), so every row is
/// computed by the same instruction sequence whatever the number of threads: results are
/// bitwise identical with 1 or N threads.
inline constexpr std::size_t row_block = 64;

namespace detail {

template <class T>
using row_major_matrix =
    Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
using eigen_map = Eigen::Map<
    std::conditional_t<std::is_const_v<T>, const row_major_matrix<T>, row_major_matrix<T>>,
    Eigen::Unaligned, Eigen::OuterStride<>>;

/// The view as an Eigen row-major matrix (no copy).
template <class T>
eigen_map<T> as_eigen(matrix_view<T> v) {
  return eigen_map<T>(v.data(), static_cast<Eigen::Index>(v.rows()),
                      static_cast<Eigen::Index>(v.cols()),
                      Eigen::OuterStride<>(static_cast<Eigen::Index>(v.stride())));
}

/// g ⊙ [v > 0], a ReLU's gradient mask, as a branch-free Eigen expression. Eigen 3.4's
/// `(v > 0).select(g, 0)` compiles to a branch per value, mispredicted for about every other
/// value of a ReLU's input (measured: a batch-norm backward with the mask fused took 3.3× the
/// time of one without it; with this product, 1.3×). Unlike select, a masked-out value is
/// 0·g: −0 for a negative g, NaN for an infinite or NaN g.
template <class Values, class Gradient>
auto relu_masked(const Eigen::ArrayBase<Values>& v, const Eigen::ArrayBase<Gradient>& g) {
  return (v > 0.0f).template cast<float>() * g;
}

/// A span as an Eigen column vector (no copy).
template <class T>
auto as_vector(std::span<T> s) {
  using vec = Eigen::Matrix<std::remove_const_t<T>, Eigen::Dynamic, 1>;
  using map = Eigen::Map<std::conditional_t<std::is_const_v<T>, const vec, vec>>;
  return map(s.data(), static_cast<Eigen::Index>(s.size()));
}

/// Calls `body(first, count)` over consecutive blocks of `row_block` rows of [0, rows), in
/// parallel when rows ≥ parallel_min_rows. Blocks are fixed by `rows` alone (simple
/// partitioner, grain 1), so the result never depends on the thread count. `body` must only
/// write to its own rows.
template <class Body>
void for_row_blocks(std::size_t rows, std::size_t block, Body&& body) {
  if (rows == 0) return;
  if (rows < parallel_min_rows) {
    body(std::size_t{0}, rows);
    return;
  }
  const std::size_t blocks = (rows + block - 1) / block;
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, blocks, 1),
      [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t b = r.begin(); b != r.end(); ++b) {
          const std::size_t first = b * block;
          body(first, std::min(block, rows - first));
        }
      },
      tbb::simple_partitioner{});
}
template <class Body>
void for_row_blocks(std::size_t rows, Body&& body) {
  for_row_blocks(rows, row_block, std::forward<Body>(body));
}

/// Runs `task(i)` for i in [0, count): in parallel (one task per chunk, simple partitioner)
/// when `parallel`, else in order on the calling thread. Each task must write disjoint memory.
template <class Task>
void run_tasks(std::size_t count, bool parallel, Task&& task) {
  if (!parallel || count < 2) {
    for (std::size_t i = 0; i < count; ++i)
      task(i);
    return;
  }
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, count, 1),
      [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t i = r.begin(); i != r.end(); ++i)
          task(i);
      },
      tbb::simple_partitioner{});
}

/// Throws `errc::size_mismatch` naming `what` when `got != want`.
inline void expect_size(std::string_view where, std::string_view what, std::size_t got,
                        std::size_t want) {
  if (got != want) [[unlikely]]
    fail(errc::size_mismatch,
         cat(where, ": ", what, " is ", got, " but must be ", want, " (check the model config)"));
}

/// Throws `errc::size_mismatch` unless `v` is rows × cols.
template <class T>
void expect_shape(std::string_view where, std::string_view what, matrix_view<T> v, std::size_t rows,
                  std::size_t cols) {
  if (v.rows() != rows || v.cols() != cols) [[unlikely]]
    fail(errc::size_mismatch,
         cat(where, ": ", what, " is ", v.rows(), " x ", v.cols(), " but must be ", rows, " x ",
             cols, " (rows = batch, cols = features)"));
}

}  // namespace detail

/// A growable row-major work matrix: `view(rows, cols)` returns a contiguous rows × cols view
/// over storage that is reallocated only when a larger size is first asked for, so per-step
/// activations cost no allocation once the largest batch has been seen. Contents are not
/// preserved across a growth. Not thread-safe.
class scratch {
 public:
  matrix_view<float> view(std::size_t rows, std::size_t cols) {
    if (rows * cols > values_.size()) values_ = aligned_buffer<float>(rows * cols);
    return {values_.data(), rows, cols};
  }

 private:
  aligned_buffer<float> values_;
};

}  // namespace strata::nn

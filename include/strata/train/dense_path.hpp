/// @file dense_path.hpp
/// The dense half of a Communicator: how one step's dense gradients (the MLPs') are summed over
/// the workers and applied.
///
/// - `dense_rows`: the dense parameters cut into rows of `row` values, the last one zero-padded
///   — the unit the dense optimizer updates, the parameter servers' dense table holds and
///   checkpoints store (the one place that pads).
/// - `allreduce_dense<Compressor, Optimizer, Allreduce>`: the workers sum the gradients among
///   themselves (strata's ring: in rank order when deterministic, through `Compressor` when
///   lossy; or another Allreduce policy such as `mpi::native_allreduce`, the MPI library's),
///   then every worker applies `Optimizer` to its own replica, so replicas stay bitwise equal.
/// - `servers_dense`: the dense parameters are one more table on the parameter servers; a
///   worker pulls them with each step's rows and pushes their gradients, the servers apply the
///   optimizer (`parameter_server<C>`).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/compress/compressed_allreduce.hpp"
#include "strata/compress/concepts.hpp"
#include "strata/compress/error_feedback.hpp"
#include "strata/compress/identity.hpp"
#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/ps/client.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/detail/exchange.hpp"

namespace strata::train {

namespace detail {
/// The codec that goes on the wire for a compressor (error_feedback<C> sends C).
template <class C>
struct wire_codec {
  using type = C;
  static constexpr bool feedback = false;
};
template <class C>
struct wire_codec<compress::error_feedback<C>> {
  using type = C;
  static constexpr bool feedback = true;
};
}  // namespace detail

/// The dense parameters (`count` floats) as rows of `row` floats; the last row holds
/// `count % row` real values and zero padding.
class dense_rows {
 public:
  dense_rows() = default;  ///< no parameters
  dense_rows(std::size_t count, std::size_t row) : count_(count), row_(row) {
    STRATA_EXPECTS(row >= 1, "dense_rows: the row length must be ≥ 1");
  }
  [[nodiscard]] std::size_t count() const noexcept { return count_; }
  [[nodiscard]] std::size_t row() const noexcept { return row_; }
  [[nodiscard]] std::size_t rows() const noexcept { return (count_ + row_ - 1) / row_; }
  [[nodiscard]] std::size_t full_rows() const noexcept { return count_ / row_; }
  /// Row r of `params` into `out` (row() values; the padding is zero).
  void read(std::span<const float> params, std::size_t r, std::span<float> out) const {
    check(params.size(), r, out.size(), "read");
    const std::size_t first = r * row_, n = std::min(row_, count_ - first);
    std::copy_n(params.begin() + static_cast<std::ptrdiff_t>(first), n, out.begin());
    std::fill(out.begin() + static_cast<std::ptrdiff_t>(n), out.end(), 0.0f);
  }
  /// The real values of `row` (row() values) back into row r of `params`.
  void write(std::span<float> params, std::size_t r, std::span<const float> row) const {
    check(params.size(), r, row.size(), "write");
    const std::size_t first = r * row_, n = std::min(row_, count_ - first);
    std::copy_n(row.begin(), n, params.begin() + static_cast<std::ptrdiff_t>(first));
  }
  /// All rows of `params`, padded, into `out` (rows() × row()).
  void read_all(std::span<const float> params, matrix_view<float> out) const {
    STRATA_EXPECTS(out.rows() == rows() && out.cols() == row_, "dense_rows::read_all: ", out.rows(),
                   " x ", out.cols(), " buffer for ", rows(), " x ", row_, " rows");
    STRATA_EXPECTS(params.size() == count_, "dense_rows::read_all: ", params.size(),
                   " parameters, expected ", count_);
    std::copy(params.begin(), params.end(), out.data());
    std::fill(out.data() + count_, out.data() + out.rows() * out.cols(), 0.0f);
  }

 private:
  void check(std::size_t params, std::size_t r, std::size_t values, const char* what) const {
    STRATA_EXPECTS(params == count_ && r < rows() && values == row_, "dense_rows::", what, ": row ",
                   r, " of ", rows(), " with ", values, " values (row length ", row_, ") over ",
                   params, " parameters (expected ", count_, ")");
  }
  std::size_t count_ = 0, row_ = 1;
};

/// Dense path of `ring_allreduce` and `hybrid`: gradients summed among the workers, then the
/// dense optimizer on every worker's replica, row by row (the function a server applies to
/// the dense table under `parameter_server`, so every strategy computes the same values).
/// One object per worker; it owns that worker's optimizer state and compressor residual.
///
/// `Allreduce` other than `comm::ring_allreduce` (e.g. `mpi::native_allreduce`) sums float32
/// gradients by calling `Allreduce{}(workers, grads)` on an endpoint of the workers only; it
/// needs a lossless Compressor and `deterministic = false` (the library picks the order).
template <compress::compressor Compressor, optim::sparse_optimizer Optimizer,
          class Allreduce = comm::ring_allreduce>
class allreduce_dense {
 public:
  using compressor_type = Compressor;
  using optimizer_type = Optimizer;
  using allreduce_type = Allreduce;
  /// Lossless: identity on the wire (error_feedback<identity> included).
  static constexpr bool lossless =
      std::is_same_v<typename detail::wire_codec<Compressor>::type, compress::identity>;
  /// The sum is another library's (not strata's ring).
  static constexpr bool foreign_allreduce = !std::is_same_v<Allreduce, comm::ring_allreduce>;
  static_assert(!foreign_allreduce || lossless,
                "a dense path over another Allreduce (e.g. mpi::native_allreduce) sums float32 "
                "gradients: compressed allreduce runs on strata's ring; use compress::identity or "
                "comm::ring_allreduce");
  /// The compressor keeps per-position state (a residual) that checkpoints must carry.
  static constexpr bool has_residual = !lossless && compress::positional_compressor<Compressor>;

  /// `allreduce` carries the sum's options: ring_allreduce::chunk_bytes (also the message size
  /// of the compressed ring; the rank-ordered sum of `deterministic` sends whole segments),
  /// native_allreduce's max_elements_per_call and poll.
  allreduce_dense(dense_rows layout, Optimizer optimizer, bool deterministic,
                  Allreduce allreduce = {})
      : layout_(layout),
        optimizer_(optimizer),
        allreduce_(allreduce),
        deterministic_(deterministic),
        state_(layout.rows() * Optimizer::state_floats(layout.row())),
        last_row_(layout.row()),
        last_grad_(layout.row()) {
    if constexpr (!foreign_allreduce)
      STRATA_EXPECTS(allreduce_.chunk_bytes >= sizeof(float),
                     "allreduce_dense: the ring's "
                     "chunk_bytes is ",
                     allreduce_.chunk_bytes,
                     "; a chunk must hold at least one "
                     "float (4 bytes; the default is 1 MiB)");
    if constexpr (foreign_allreduce)
      STRATA_EXPECTS(!deterministic, "allreduce_dense: ", Allreduce::name,
                     " leaves the summation order to its library, so it cannot give rank-ordered "
                     "(deterministic) sums: set trainer_options::deterministic = false, or use "
                     "strata's ring (hybrid<Consistency>)");
    if constexpr (!lossless) {
      if constexpr (compress::positional_compressor<Compressor>)
        codec_.emplace(layout.count());
      else
        codec_.emplace();
    }
  }

  /// Sums `grads` (this worker's, the dense count) over the workers of `workers`, in place.
  template <comm::transport T>
  void sum(T& workers, std::span<float> grads) {
    STRATA_EXPECTS(grads.size() == layout_.count(), "allreduce_dense::sum: ", grads.size(),
                   " gradients for ", layout_.count(), " dense parameters");
    if constexpr (foreign_allreduce)
      allreduce_(workers, grads);
    else if constexpr (!lossless)
      compress::compressed_allreduce(workers, grads, *codec_, comm::reduce_op::sum,
                                     allreduce_.chunk_bytes / sizeof(float));
    else if (deterministic_)
      detail::ordered_allreduce(workers, grads);
    else
      allreduce_(workers, grads);
  }

  /// The optimizer on `params` with the summed `grads`, row by row: rows are independent, so
  /// oneTBB runs blocks of ≥ 32 K floats in parallel (the same values in any order).
  void apply(std::span<float> params, std::span<const float> grads) {
    STRATA_EXPECTS(params.size() == layout_.count() && grads.size() == layout_.count(),
                   "allreduce_dense::apply: ", params.size(), " parameters and ", grads.size(),
                   " gradients for ", layout_.count());
    const std::size_t d = layout_.row(), sf = Optimizer::state_floats(d);
    const std::size_t full = layout_.full_rows();
    const auto state = state_.span();
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, full, std::max<std::size_t>(1, 32768 / d)),
                      [&](const tbb::blocked_range<std::size_t>& rows) {
                        for (std::size_t r = rows.begin(); r < rows.end(); ++r)
                          optimizer_.apply(params.subspan(r * d, d), state.subspan(r * sf, sf),
                                           grads.subspan(r * d, d));
                      });
    if (full < layout_.rows()) {  // the last, padded row
      layout_.read(params, full, last_row_);
      layout_.read(grads, full, last_grad_);
      optimizer_.apply(std::span<float>(last_row_), state.subspan(full * sf, sf),
                       std::span<const float>(last_grad_));
      layout_.write(params, full, last_row_);
    }
  }

  /// Sums per-batch statistics (e.g. batch norm's Σx, Σx² per channel) over the workers, in
  /// place, in float64 and lossless whatever the Compressor: the collective of synchronised
  /// batch norm. Rank-ordered when deterministic, else the same Allreduce as the gradients.
  template <comm::transport T>
  void sum_statistics(T& workers, std::span<double> values) {
    if constexpr (foreign_allreduce)
      allreduce_(workers, values);
    else if (deterministic_)
      detail::ordered_allreduce(workers, values);
    else
      comm::allreduce(workers, values, comm::reduce_op::sum, allreduce_);
  }

  /// The optimizer's hyper-parameters, e.g. to follow a learning-rate schedule between steps.
  [[nodiscard]] Optimizer& optimizer() noexcept { return optimizer_; }
  [[nodiscard]] const Optimizer& optimizer() const noexcept { return optimizer_; }

  // ---- checkpoint hooks: the replica's rows with their optimizer state, and the residual ----

  /// Calls add(table, r, row, state) for every row r of the replica `params` (padded) with its
  /// optimizer state: the dense table of a checkpoint.
  template <class Add>
  void save_rows(std::span<const float> params, std::size_t table, Add&& add) const {
    const std::size_t sf = Optimizer::state_floats(layout_.row());
    std::vector<float> row(layout_.row());
    for (std::size_t r = 0; r < layout_.rows(); ++r) {
      layout_.read(params, r, row);
      add(table, std::uint64_t{r}, std::span<const float>(row), state().subspan(r * sf, sf));
    }
  }
  /// Row r of a checkpoint's dense table into the replica `params` and the optimizer state.
  void load_row(std::span<float> params, std::uint64_t r, std::span<const float> row,
                std::span<const float> row_state) {
    const std::size_t sf = Optimizer::state_floats(layout_.row());
    STRATA_EXPECTS(row_state.size() == sf, "allreduce_dense::load_row: ", row_state.size(),
                   " state values, the optimizer keeps ", sf);
    layout_.write(params, static_cast<std::size_t>(r), row);
    std::copy(row_state.begin(), row_state.end(),
              state_.span().begin() + static_cast<std::ptrdiff_t>(r * sf));
  }
  /// The compressor's residual as section `residual` (nothing when it keeps none).
  void save_residual(checkpoint_writer& out) const {
    if constexpr (has_residual) out.add_values<float>("residual", residual());
  }
  /// The residual from a worker's checkpoint file; forgotten when `saved` is null or has none
  /// (another worker count, or a run without this compressor).
  void load_residual(const checkpoint_reader* saved) {
    if constexpr (has_residual) {
      if (saved != nullptr && saved->has("residual"))
        restore_residual(saved->values<float>("residual", layout_.count()));
      else
        restore_residual({});
    }
  }

  [[nodiscard]] const dense_rows& layout() const noexcept { return layout_; }
  /// Optimizer state of every row (rows() × state_floats(row)), for checkpoints.
  [[nodiscard]] std::span<float> state() noexcept { return state_.span(); }
  [[nodiscard]] std::span<const float> state() const noexcept { return state_.span(); }
  /// The compressor's residual (empty unless has_residual), for checkpoints.
  [[nodiscard]] std::span<const float> residual() const {
    if constexpr (has_residual)
      return codec_->residual();
    else
      return {};
  }
  /// Restores a checkpointed residual (`values` empty: forget it).
  void restore_residual(std::span<const float> values) {
    if constexpr (has_residual) {
      if (values.empty())
        codec_->reset();
      else
        codec_->restore_residual(values);
    } else {
      STRATA_EXPECTS(values.empty(), "allreduce_dense: ", Compressor::name,
                     " keeps no residual to restore");
    }
  }

 private:
  dense_rows layout_;
  Optimizer optimizer_;
  Allreduce allreduce_;
  bool deterministic_;
  aligned_buffer<float> state_;
  std::optional<Compressor> codec_;
  std::vector<float> last_row_, last_grad_;
};

/// Dense path of `parameter_server`: the dense parameters are table `table` of the servers'
/// map, `layout.rows()` rows of `layout.row()`. A worker pulls them in the same round trip as
/// the step's embedding rows (`pull_request`, then `take`) and pushes the gradients as that
/// table's rows (`push`); the servers apply the dense optimizer.
class servers_dense {
 public:
  servers_dense(dense_rows layout, std::size_t table)
      : layout_(layout),
        table_(table),
        keys_(layout.rows()),
        pulled_(layout.rows(), layout.row()),
        pushed_(layout.rows(), layout.row()) {
    std::iota(keys_.begin(), keys_.end(), std::uint64_t{0});
  }
  /// The pull of every dense row, into this object's pull buffer (it stays valid, and apart
  /// from the push buffer, while a split-phase pull is in flight).
  [[nodiscard]] ps::table_pull pull_request() { return {table_, keys_, pulled_.view()}; }
  /// After the pull: the servers' parameters into `params`.
  void take(std::span<float> params) const {
    STRATA_EXPECTS(params.size() == layout_.count(), "servers_dense::take: ", params.size(),
                   " parameters, expected ", layout_.count());
    std::copy_n(pulled_.data(), params.size(), params.begin());
  }
  /// Pushes this worker's dense gradients (padded to whole rows) through `storage`.
  template <class Storage>
  void push(Storage& storage, std::span<const float> grads) {
    layout_.read_all(grads, pushed_.view());
    storage.apply_gradients(table_, keys_, pushed_.view());
  }
  // ---- checkpoint hooks: the servers hold the rows and their state; a worker keeps none ----

  /// Row r of a checkpoint's dense table into the worker's replica `params` (the state is the
  /// servers', loaded there).
  void load_row(std::span<float> params, std::uint64_t r, std::span<const float> row,
                std::span<const float> /*state*/) const {
    layout_.write(params, static_cast<std::size_t>(r), row);
  }
  void save_residual(checkpoint_writer& /*out*/) const {}
  void load_residual(const checkpoint_reader* /*saved*/) {}

  [[nodiscard]] const dense_rows& layout() const noexcept { return layout_; }
  [[nodiscard]] std::size_t table() const noexcept { return table_; }

 private:
  dense_rows layout_;
  std::size_t table_;
  std::vector<std::uint64_t> keys_;
  matrix<float> pulled_, pushed_;
};

}  // namespace strata::train

/// @file batch_norm.hpp
/// Batch normalisation over the rows of NHWC batches (per channel), training and inference
/// modes, running statistics, optional synchronisation of the batch statistics over workers.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/parameters.hpp"

namespace strata::nn {

/// Training (batch statistics, running statistics updated) or inference (running statistics).
enum class mode { train, eval };

/// Sums per-channel statistics over all data-parallel workers in place (an allreduce with
/// `reduce_op::sum`), e.g. `[&t](std::span<double> s) { strata::comm::allreduce(t, s); }`.
/// Every worker must call it the same number of times with the same lengths. An empty
/// function keeps the statistics per worker.
using stat_reducer = std::function<void(std::span<double>)>;

/// Batch normalisation of a (rows × C) matrix per column — for NHWC maps each row is one
/// pixel, so statistics are over batch and space as in BatchNorm2d; for (N × C) features it is
/// BatchNorm1d:
/// ```
/// train: μ = Σx / M,  σ² = Σ(x − μ)² / M (biased),  y = γ·(x − μ)/sqrt(σ² + ε) + β
///        running_mean ← (1 − m)·running_mean + m·μ;  running_var ← (1 − m)·running_var + m·σ²·M/(M
///        − 1)
/// eval:  y = γ·(x − running_mean)/sqrt(running_var + ε) + β
/// ```
/// (PyTorch's conventions; momentum m = 0.1, ε = 1e-5 by default). γ ("<name>.weight") and β
/// ("<name>.bias") are parameter blocks; call `init(values)` after `allocate` to set γ = 1
/// (parameter_set has no "ones" scheme). The running statistics are held by the layer.
///
/// Synchronised BN: in training mode the per-batch sums [M, Σx_c…, Σx_c²…] (2C + 1 doubles)
/// are passed to the `stat_reducer` before normalising, and in backward [Σdy_c…, Σdy_c·x̂_c…]
/// (2C doubles) before the input gradient is formed; with an allreduce as reducer, N workers
/// each holding a shard normalise with the statistics of the global batch — exactly one
/// worker on the whole batch. dγ = Σdy·x̂ and dβ = Σdy written to the gradient buffer are the
/// worker's local sums (the caller allreduces gradients as usual).
///
/// Cost: two passes forward (sums in float per 1024-row block, combined in double; then
/// normalise), two backward. Parallel over
/// fixed 1024-row blocks; per-block sums combined in block order, so results never depend on
/// the thread count. Stateful (running statistics, last batch's μ and 1/σ): not thread-safe.
class batch_norm {
 public:
  /// Rows per parallel block of the statistics and normalisation passes.
  static constexpr std::size_t block_rows = 1024;

  batch_norm() = default;
  batch_norm(parameter_set& params, std::size_t channels, const std::string& name,
             float momentum = 0.1f, float eps = 1e-5f)
      : channels_(channels), momentum_(momentum), eps_(eps) {
    STRATA_EXPECTS(channels > 0, "batch_norm '", name, "': channels must be positive");
    STRATA_EXPECTS(momentum >= 0.0f && momentum <= 1.0f, "batch_norm '", name, "': momentum ",
                   momentum, " must be in [0, 1]");
    STRATA_EXPECTS(eps > 0.0f, "batch_norm '", name, "': eps must be positive, got ", eps);
    gamma_offset_ = params.add(name + ".weight", channels, init_scheme::zeros);
    beta_offset_ = params.add(name + ".bias", channels, init_scheme::zeros);
    running_mean_.assign(channels, 0.0f);
    running_var_.assign(channels, 1.0f);
    mean_.assign(channels, 0.0f);
    inv_std_.assign(channels, 1.0f);
  }

  [[nodiscard]] std::size_t channels() const noexcept { return channels_; }
  /// Length of the forward statistics vector handed to the reducer: 2C + 1.
  [[nodiscard]] std::size_t forward_stats_size() const noexcept { return 2 * channels_ + 1; }
  /// Length of the backward statistics vector handed to the reducer: 2C.
  [[nodiscard]] std::size_t backward_stats_size() const noexcept { return 2 * channels_; }

  /// γ and β as spans into a flat buffer (values or gradients).
  template <class T>
  [[nodiscard]] std::span<T> gamma(std::span<T> flat) const {
    check_flat(flat.size());
    return flat.subspan(gamma_offset_, channels_);
  }
  template <class T>
  [[nodiscard]] std::span<T> beta(std::span<T> flat) const {
    check_flat(flat.size());
    return flat.subspan(beta_offset_, channels_);
  }
  /// Sets γ = 1, β = 0 in `values` and resets the running statistics (mean 0, var 1).
  void init(std::span<float> values) {
    std::ranges::fill(gamma(values), 1.0f);
    std::ranges::fill(beta(values), 0.0f);
    std::ranges::fill(running_mean_, 0.0f);
    std::ranges::fill(running_var_, 1.0f);
  }

  [[nodiscard]] std::span<float> running_mean() noexcept { return running_mean_; }
  [[nodiscard]] std::span<const float> running_mean() const noexcept { return running_mean_; }
  [[nodiscard]] std::span<float> running_var() noexcept { return running_var_; }
  [[nodiscard]] std::span<const float> running_var() const noexcept { return running_var_; }

  /// Per-batch sums of x: out = [rows, Σx_0 … Σx_{C−1}, Σx_0² … Σx_{C−1}²] (2C + 1 doubles).
  void batch_sums(matrix_view<const float> x, std::span<double> out) const {
    detail::expect_shape("batch_norm::batch_sums", "x", x, x.rows(), channels_);
    detail::expect_size("batch_norm::batch_sums", "out", out.size(), forward_stats_size());
    reduce_blocks(x.rows(), out.subspan(1), [&](std::size_t first, std::size_t count, double* s) {
      // Float sums within a block (vectorised row adds), combined across blocks in double.
      const auto xb = detail::as_eigen(x.rows_slice(first, count)).array();
      Eigen::Map<Eigen::VectorXd>(s, static_cast<Eigen::Index>(channels_)) =
          xb.colwise().sum().transpose().template cast<double>();
      Eigen::Map<Eigen::VectorXd>(s + channels_, static_cast<Eigen::Index>(channels_)) =
          xb.square().colwise().sum().transpose().template cast<double>();
    });
    out[0] = static_cast<double>(x.rows());
  }

  /// y ← BN(x). Training mode: batch statistics (summed by `sync` when given), running
  /// statistics updated, μ and 1/σ kept for backward. `y` may be `x`.
  void forward(std::span<const float> params, matrix_view<const float> x, matrix_view<float> y,
               mode m, const stat_reducer& sync = {}) {
    detail::expect_shape("batch_norm::forward", "x", x, x.rows(), channels_);
    detail::expect_shape("batch_norm::forward", "y", y, x.rows(), channels_);
    if (m == mode::train) {
      stats_.assign(forward_stats_size(), 0.0);
      batch_sums(x, stats_);
      if (sync) sync(stats_);
      const double count = stats_[0];
      if (!(count >= 2.0))
        fail(errc::invalid_argument,
             cat("batch_norm::forward: training mode needs at least 2 values per channel, got ",
                 count, " (batch x pixels); use a larger batch or eval mode"));
      for (std::size_t c = 0; c < channels_; ++c) {
        const double mean = stats_[1 + c] / count;
        const double var = std::max(0.0, stats_[1 + channels_ + c] / count - mean * mean);
        mean_[c] = static_cast<float>(mean);
        inv_std_[c] = static_cast<float>(1.0 / std::sqrt(var + static_cast<double>(eps_)));
        running_mean_[c] = (1.0f - momentum_) * running_mean_[c] + momentum_ * mean_[c];
        running_var_[c] = (1.0f - momentum_) * running_var_[c] +
                          momentum_ * static_cast<float>(var * count / (count - 1.0));
      }
    } else {
      for (std::size_t c = 0; c < channels_; ++c) {
        mean_[c] = running_mean_[c];
        inv_std_[c] = 1.0f / std::sqrt(running_var_[c] + eps_);
      }
    }
    last_mode_ = m;
    last_rows_ = x.rows();
    // y = x·scale + shift with scale = γ/σ, shift = β − μ·γ/σ.
    Eigen::RowVectorXf scale(static_cast<Eigen::Index>(channels_));
    Eigen::RowVectorXf shift(static_cast<Eigen::Index>(channels_));
    const auto g = gamma(params);
    const auto b = beta(params);
    for (std::size_t c = 0; c < channels_; ++c) {
      scale[static_cast<Eigen::Index>(c)] = g[c] * inv_std_[c];
      shift[static_cast<Eigen::Index>(c)] = b[c] - mean_[c] * g[c] * inv_std_[c];
    }
    detail::for_row_blocks(x.rows(), block_rows, [&](std::size_t first, std::size_t count) {
      auto yb = detail::as_eigen(y.rows_slice(first, count));
      yb = (detail::as_eigen(x.rows_slice(first, count)).array().rowwise() * scale.array())
               .rowwise() +
           shift.array();
    });
  }

  /// From dy = dL/dy of the last forward (same x): overwrites dγ, dβ in `grads` (local sums)
  /// and writes dx (may alias dy). Training mode: with x̂ = (x − μ)/σ and means over the
  /// (synchronised) batch of M rows,
  /// `dx = γ/σ · (dy − mean(dy) − x̂·mean(dy·x̂))`; eval mode: `dx = γ/σ · dy`.
  void backward(std::span<const float> params, matrix_view<const float> x,
                matrix_view<const float> dy, std::span<float> grads, matrix_view<float> dx,
                const stat_reducer& sync = {}) {
    detail::expect_shape("batch_norm::backward", "x", x, x.rows(), channels_);
    detail::expect_shape("batch_norm::backward", "dy", dy, x.rows(), channels_);
    detail::expect_shape("batch_norm::backward", "dx", dx, x.rows(), channels_);
    if (last_rows_ != x.rows())
      fail(errc::invalid_argument,
           cat("batch_norm::backward: x has ", x.rows(), " rows but the last forward had ",
               last_rows_, "; call forward on the same batch first"));
    const Eigen::Map<const Eigen::RowVectorXf> mean(mean_.data(),
                                                    static_cast<Eigen::Index>(channels_));
    const Eigen::Map<const Eigen::RowVectorXf> inv_std(inv_std_.data(),
                                                       static_cast<Eigen::Index>(channels_));
    // Local sums Σdy and Σdy·x̂ (doubles, block order).
    std::vector<double> sums(backward_stats_size(), 0.0);
    reduce_blocks(x.rows(), sums, [&](std::size_t first, std::size_t count, double* s) {
      const auto xb = detail::as_eigen(x.rows_slice(first, count)).array();
      const auto dyb = detail::as_eigen(dy.rows_slice(first, count)).array();
      const auto xhat = (xb.rowwise() - mean.array()).rowwise() * inv_std.array();
      Eigen::Map<Eigen::VectorXd>(s, static_cast<Eigen::Index>(channels_)) =
          dyb.colwise().sum().transpose().template cast<double>();
      Eigen::Map<Eigen::VectorXd>(s + channels_, static_cast<Eigen::Index>(channels_)) =
          (dyb * xhat).colwise().sum().transpose().template cast<double>();
    });
    auto dg = gamma(grads);
    auto dbeta = beta(grads);
    for (std::size_t c = 0; c < channels_; ++c) {
      dbeta[c] = static_cast<float>(sums[c]);
      dg[c] = static_cast<float>(sums[channels_ + c]);
    }
    const auto g = gamma(params);
    Eigen::RowVectorXf a(static_cast<Eigen::Index>(channels_));  // γ/σ
    Eigen::RowVectorXf mdy = Eigen::RowVectorXf::Zero(static_cast<Eigen::Index>(channels_));
    Eigen::RowVectorXf mdyx = Eigen::RowVectorXf::Zero(static_cast<Eigen::Index>(channels_));
    if (last_mode_ == mode::train) {
      if (sync) sync(sums);
      const double count = stats_[0];
      for (std::size_t c = 0; c < channels_; ++c) {
        mdy[static_cast<Eigen::Index>(c)] = static_cast<float>(sums[c] / count);
        mdyx[static_cast<Eigen::Index>(c)] = static_cast<float>(sums[channels_ + c] / count);
      }
    }
    for (std::size_t c = 0; c < channels_; ++c)
      a[static_cast<Eigen::Index>(c)] = g[c] * inv_std_[c];
    detail::for_row_blocks(x.rows(), block_rows, [&](std::size_t first, std::size_t count) {
      const auto xb = detail::as_eigen(x.rows_slice(first, count)).array();
      const auto dyb = detail::as_eigen(dy.rows_slice(first, count)).array();
      const auto xhat = (xb.rowwise() - mean.array()).rowwise() * inv_std.array();
      auto dxb = detail::as_eigen(dx.rows_slice(first, count));
      dxb = (((dyb.rowwise() - mdy.array()) - xhat.rowwise() * mdyx.array()).rowwise() * a.array())
                .eval();
    });
  }

 private:
  /// out[i] = Σ over fixed row blocks (in block order) of what `fill(first, count, s)` writes
  /// into its block's s[0 .. out.size()).
  template <class Fill>
  void reduce_blocks(std::size_t rows, std::span<double> out, Fill&& fill) const {
    const std::size_t blocks = (rows + block_rows - 1) / block_rows;
    const std::size_t width = out.size();
    partial_.assign(blocks * width, 0.0);
    detail::run_tasks(blocks, rows >= 2 * block_rows, [&](std::size_t b) {
      const std::size_t first = b * block_rows;
      fill(first, std::min(block_rows, rows - first), partial_.data() + b * width);
    });
    std::ranges::fill(out, 0.0);
    for (std::size_t b = 0; b < blocks; ++b)
      for (std::size_t i = 0; i < width; ++i)
        out[i] += partial_[b * width + i];
  }

  void check_flat(std::size_t size) const {
    if (size < beta_offset_ + channels_)
      fail(errc::size_mismatch, cat("batch_norm: flat parameter buffer of ", size,
                                    " values is too small for a layer ending at ",
                                    beta_offset_ + channels_, "; pass the model's whole buffer"));
  }

  std::size_t channels_ = 0;
  float momentum_ = 0.1f;
  float eps_ = 1e-5f;
  std::size_t gamma_offset_ = 0;
  std::size_t beta_offset_ = 0;
  std::vector<float> running_mean_, running_var_;
  std::vector<float> mean_, inv_std_;  // of the last forward
  std::vector<double> stats_;          // last forward's (synchronised) sums
  mode last_mode_ = mode::train;
  std::size_t last_rows_ = static_cast<std::size_t>(-1);
  mutable std::vector<double> partial_;
};

}  // namespace strata::nn

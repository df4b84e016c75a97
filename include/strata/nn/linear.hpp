/// @file linear.hpp
/// Fully connected layer y = x·Wᵀ + b on row-major batches, with an optional fused ReLU.
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/gemm.hpp"
#include "strata/nn/parameters.hpp"

namespace strata::nn {

/// Activation fused into a layer's output.
enum class activation { none, relu };

/// How `linear::backward` returns the input gradient: `plain` writes dL/dx; `through_relu`
/// assumes x is the output of a ReLU and writes dL/d(ReLU input) = dL/dx ⊙ [x > 0].
enum class input_grad { plain, through_relu };

/// A fully connected layer: `y = act(x·Wᵀ + b)`, x: batch × in, W: out × in (row-major, as in
/// PyTorch), b: out. The layer owns no memory: W and b are the blocks "<name>.weight"
/// (xavier_uniform) and "<name>.bias" (fan_in_uniform) it registered in a parameter_set, and
/// every call takes the set's flat values (and gradients) span.
///
/// Cost: forward 2·batch·in·out flops; backward 4·batch·in·out (2 without dx). Products run on
/// the layer's GEMM engine (`set_engine`, default `default_gemm_engine()`: oneDNN, CBLAS or
/// Eigen, see nn/gemm.hpp), single-threaded per block; the bias is the GEMM's initial output
/// (beta = 1), the ReLU one pass over the block while it is in cache. Parallel (oneTBB) over fixed
/// 128-row blocks for batch ≥ 256: dX and y row blocks are independent, dW = dYᵀX is split over
/// fixed chunks of output rows, each one GEMM over the whole batch, and db is one column sum — so
/// results are bitwise identical whatever the thread count. Const and re-entrant: concurrent calls
/// on distinct buffers are safe.
class linear {
 public:
  /// Rows of dW computed by one task.
  static constexpr std::size_t dw_chunk = 64;

  linear() = default;
  /// Registers weight and bias blocks of an `in` → `out` layer in `params`.
  linear(parameter_set& params, std::size_t in, std::size_t out, const std::string& name)
      : linear(add_linear(params, in, out, name)) {}
  /// A layer over blocks already registered (add_linear, add_mlp).
  explicit linear(const linear_blocks& blocks)
      : in_(blocks.in),
        out_(blocks.out),
        weight_offset_(blocks.weight_offset),
        bias_offset_(blocks.bias_offset) {}

  [[nodiscard]] std::size_t in() const noexcept { return in_; }
  [[nodiscard]] std::size_t out() const noexcept { return out_; }
  [[nodiscard]] std::size_t weight_offset() const noexcept { return weight_offset_; }
  [[nodiscard]] std::size_t bias_offset() const noexcept { return bias_offset_; }
  /// The library computing this layer's products.
  [[nodiscard]] gemm_engine engine() const noexcept { return engine_; }
  /// Chooses the library computing this layer's products; errc::unsupported when this build
  /// lacks it. Every engine gives the same values up to float rounding; each one is bitwise
  /// independent of the thread count.
  void set_engine(gemm_engine engine) {
    expect_gemm_available(engine, "linear::set_engine");
    engine_ = engine;
  }
  /// W as an out × in view into a flat buffer (values or gradients).
  template <class T>
  [[nodiscard]] matrix_view<T> weight(std::span<T> flat) const {
    check_flat(flat.size());
    return {flat.data() + weight_offset_, out_, in_};
  }
  /// b as a span into a flat buffer.
  template <class T>
  [[nodiscard]] std::span<T> bias(std::span<T> flat) const {
    check_flat(flat.size());
    return flat.subspan(bias_offset_, out_);
  }

  /// y ← act(x·Wᵀ + b).
  void forward(std::span<const float> params, matrix_view<const float> x, matrix_view<float> y,
               activation act = activation::none) const {
    detail::expect_shape("linear::forward", "x", x, x.rows(), in_);
    detail::expect_shape("linear::forward", "y", y, x.rows(), out_);
    const matrix_view<const float> w = weight(params);
    const auto b = detail::as_vector(bias(params)).transpose();
    detail::for_row_blocks(x.rows(), [&](std::size_t first, std::size_t count) {
      const matrix_view<float> yb = y.rows_slice(first, count);
      auto ye = detail::as_eigen(yb);
      ye.rowwise() = b;
      detail::gemm(engine_, x.rows_slice(first, count), false, w, true, 1.0f, yb);
      if (act == activation::relu) ye = ye.cwiseMax(0.0f);
    });
  }

  /// Overwrites this layer's dW = dYᵀ·x and db = Σ_rows dY in `grads` (the flat gradient
  /// buffer) and writes dx = dY·W (masked by x > 0 for `input_grad::through_relu`).
  /// dy is the gradient with respect to the layer's pre-activation output.
  void backward(std::span<const float> params, matrix_view<const float> x,
                matrix_view<const float> dy, std::span<float> grads, matrix_view<float> dx,
                input_grad mode = input_grad::plain) const {
    detail::expect_shape("linear::backward", "dx", dx, x.rows(), in_);
    run_backward(params, x, dy, grads, &dx, mode);
  }
  /// As above without the input gradient (first layer of a network).
  void backward(std::span<const float> params, matrix_view<const float> x,
                matrix_view<const float> dy, std::span<float> grads) const {
    run_backward(params, x, dy, grads, nullptr, input_grad::plain);
  }

 private:
  void check_flat(std::size_t size) const {
    if (size < bias_offset_ + out_)
      fail(errc::size_mismatch, cat("linear: flat parameter buffer of ", size,
                                    " values is too small for a layer ending at ",
                                    bias_offset_ + out_, "; pass the model's whole buffer"));
  }

  void run_backward(std::span<const float> params, matrix_view<const float> x,
                    matrix_view<const float> dy, std::span<float> grads, matrix_view<float>* dx,
                    input_grad mode) const {
    detail::expect_shape("linear::backward", "x", x, x.rows(), in_);
    detail::expect_shape("linear::backward", "dy", dy, x.rows(), out_);
    const std::size_t rows = x.rows();
    const matrix_view<const float> w = weight(params);
    const matrix_view<float> dw = weight(grads);
    auto db = detail::as_vector(bias(grads));
    const auto dye = detail::as_eigen(dy);
    // Tasks: [0, w_tasks) dW row chunks, then one db task, then dX row blocks.
    const std::size_t w_tasks = (out_ + dw_chunk - 1) / dw_chunk;
    const std::size_t x_tasks = dx != nullptr ? (rows + row_block - 1) / row_block : 0;
    const bool parallel = rows >= parallel_min_rows;
    const std::size_t x_block = parallel ? row_block : std::max<std::size_t>(rows, 1);
    const std::size_t x_count = parallel ? x_tasks : (dx != nullptr && rows > 0 ? 1 : 0);
    detail::run_tasks(w_tasks + 1 + x_count, parallel, [&](std::size_t task) {
      if (task < w_tasks) {
        const std::size_t first = task * dw_chunk;
        const std::size_t count = std::min(dw_chunk, out_ - first);
        // dW rows [first, first + count) = dY[:, first:first + count]ᵀ · x
        const matrix_view<const float> dy_cols(dy.data() + first, rows, count, dy.stride());
        detail::gemm(engine_, dy_cols, true, x, false, 0.0f, dw.rows_slice(first, count));
      } else if (task == w_tasks) {
        if (rows == 0)
          db.setZero();
        else
          db.noalias() = dye.colwise().sum().transpose();
      } else {
        const std::size_t first = (task - w_tasks - 1) * x_block;
        const std::size_t count = std::min(x_block, rows - first);
        const matrix_view<float> dx_block = dx->rows_slice(first, count);
        detail::gemm(engine_, dy.rows_slice(first, count), false, w, false, 0.0f, dx_block);
        auto dxb = detail::as_eigen(dx_block);
        if (mode == input_grad::through_relu)
          dxb.array() = detail::relu_masked(detail::as_eigen(x.rows_slice(first, count)).array(),
                                            dxb.array());
      }
    });
  }

  std::size_t in_ = 0;
  std::size_t out_ = 0;
  std::size_t weight_offset_ = 0;
  std::size_t bias_offset_ = 0;
  gemm_engine engine_ = default_gemm_engine();
};

}  // namespace strata::nn

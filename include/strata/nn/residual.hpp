/// @file residual.hpp
/// Residual pieces of a ResNet: the parameter-free "option A" shortcut and the basic block
/// (conv-BN-ReLU-conv-BN + shortcut, ReLU), with explicit backward.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/batch_norm.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/conv2d.hpp"
#include "strata/nn/feature_map.hpp"
#include "strata/nn/parameters.hpp"

namespace strata::nn {

/// The identity shortcut of He et al. (2016) "option A", for a block that changes the map
/// size or widens the channels: spatial subsampling by `stride` and zero channels appended,
/// `S(x)[n, oh, ow, c] = c < Cin ? x[n, oh·s, ow·s, c] : 0`, output ceil(H/s) × ceil(W/s) ×
/// Cout. With stride 1 and Cout = Cin it is the identity. No parameters. Cost: one copy of
/// the output; parallel over sample chunks. Stateless; const.
class shortcut {
 public:
  shortcut() = default;
  shortcut(map_shape in, std::size_t out_channels, std::size_t stride) : in_(in), stride_(stride) {
    STRATA_EXPECTS(stride > 0, "shortcut: stride must be positive");
    STRATA_EXPECTS(out_channels >= in.channels, "shortcut: option A cannot narrow ", in.channels,
                   " channels to ", out_channels, " (it pads with zeros)");
    out_ = {(in.height + stride - 1) / stride, (in.width + stride - 1) / stride, out_channels};
  }
  [[nodiscard]] const map_shape& input_shape() const noexcept { return in_; }
  [[nodiscard]] const map_shape& output_shape() const noexcept { return out_; }

  /// y += S(x).
  void add_forward(matrix_view<const float> x, matrix_view<float> y) const {
    const std::size_t batch = detail::batch_of("shortcut::add_forward", "x", x, in_);
    detail::expect_maps("shortcut::add_forward", "y", y, out_, batch);
    detail::for_sample_chunks(
        batch, out_.pixels(), [&](std::size_t, std::size_t first, std::size_t count) {
          for (std::size_t n = first; n < first + count; ++n)
            for (std::size_t oh = 0; oh < out_.height; ++oh)
              for (std::size_t ow = 0; ow < out_.width; ++ow)
                run(y.data() + (n * out_.pixels() + oh * out_.width + ow) * out_.channels) +=
                    crun(x.data() + (n * in_.pixels() + oh * stride_ * in_.width + ow * stride_) *
                                        in_.channels);
        });
  }

  /// y_r += S(x)_r for output row r alone (r = n·Ho·Wo + oh·Wo + ow): basic_block's fused
  /// epilogue adds the shortcut while the row is in cache. `y_row` holds Cout values.
  /// Unchecked (it runs once per row): the caller has checked that x holds a batch of input
  /// maps with a sample for row r, as add_forward does.
  void add_row(matrix_view<const float> x, std::size_t r, std::span<float> y_row) const noexcept {
    const std::size_t n = r / out_.pixels();
    const std::size_t p = r - n * out_.pixels();
    const std::size_t oh = p / out_.width;
    const std::size_t ow = p - oh * out_.width;
    run(y_row.data()) += crun(
        x.data() + (n * in_.pixels() + oh * stride_ * in_.width + ow * stride_) * in_.channels);
  }

  /// dx += Sᵀ(dy): the gradient reaching x through the shortcut.
  void add_backward(matrix_view<const float> dy, matrix_view<float> dx) const {
    add_backward("shortcut::add_backward", dy, dx,
                 [&](float* to, std::size_t from) { run(to) += crun(dy.data() + from); });
  }

  /// dx += Sᵀ(dy ⊙ [y > 0]): the gradient reaching x through the shortcut when a ReLU with
  /// output y followed the sum (basic_block), without a masked copy of dy.
  void add_backward_through_relu(matrix_view<const float> dy, matrix_view<const float> y,
                                 matrix_view<float> dx) const {
    detail::expect_shape("shortcut::add_backward_through_relu", "y", y, dy.rows(), dy.cols());
    add_backward("shortcut::add_backward_through_relu", dy, dx, [&](float* to, std::size_t from) {
      run(to).array() +=
          detail::relu_masked(crun(y.data() + from).array(), crun(dy.data() + from).array());
    });
  }

 private:
  /// dx += Sᵀ(g): `add(to, from)` adds the first Cin values of g's row at offset `from` of
  /// dy's layout to the dx row at `to`.
  template <class AddRow>
  void add_backward(std::string_view where, matrix_view<const float> dy, matrix_view<float> dx,
                    AddRow&& add) const {
    const std::size_t batch = detail::batch_of(where, "dy", dy, out_);
    detail::expect_maps(where, "dx", dx, in_, batch);
    detail::for_sample_chunks(
        batch, out_.pixels(), [&](std::size_t, std::size_t first, std::size_t count) {
          for (std::size_t n = first; n < first + count; ++n)
            for (std::size_t oh = 0; oh < out_.height; ++oh)
              for (std::size_t ow = 0; ow < out_.width; ++ow) {
                float* to =
                    dx.data() +
                    (n * in_.pixels() + oh * stride_ * in_.width + ow * stride_) * in_.channels;
                add(to, (n * out_.pixels() + oh * out_.width + ow) * out_.channels);
              }
        });
  }

  [[nodiscard]] Eigen::Map<Eigen::VectorXf> run(float* p) const {
    return {p, static_cast<Eigen::Index>(in_.channels)};
  }
  [[nodiscard]] Eigen::Map<const Eigen::VectorXf> crun(const float* p) const {
    return {p, static_cast<Eigen::Index>(in_.channels)};
  }

  map_shape in_{}, out_{};
  std::size_t stride_ = 1;
};

/// ResNet basic block (He et al., 2016), NHWC:
/// ```
/// r1 = relu(bn1(conv1(x)))          // 3×3, stride s, Cin → Cout
/// y  = relu(bn2(conv2(r1)) + S(x))  // 3×3, stride 1; S = option-A shortcut
/// ```
/// Convolutions have no bias (BN follows). Parameters, in order: conv1.weight, bn1.weight,
/// bn1.bias, conv2.weight, bn2.weight, bn2.bias under "<name>.". Call `init(values)` after
/// allocating the parameter set (γ = 1). Keeps the intermediate maps of the last forward for
/// backward (≈ 3 output-sized buffers). Cost: two convolutions; around them the element-wise
/// work is fused into the batch norms' passes (BN + ReLU, BN + shortcut + ReLU forward; the
/// ReLU masks inside BN's backward passes), 7 passes over an output-sized map forward and 16
/// backward instead of 13 and 19. Not thread-safe.
class basic_block {
 public:
  basic_block() = default;
  basic_block(parameter_set& params, map_shape in, std::size_t out_channels, std::size_t stride,
              const std::string& name, float bn_momentum = 0.1f, float bn_eps = 1e-5f)
      : conv1_(params, in, out_channels, {3, stride, 1}, false, name + ".conv1"),
        bn1_(params, out_channels, name + ".bn1", bn_momentum, bn_eps),
        conv2_(params, conv1_.output_shape(), out_channels, {3, 1, 1}, false, name + ".conv2"),
        bn2_(params, out_channels, name + ".bn2", bn_momentum, bn_eps),
        shortcut_(in, out_channels, stride) {
    STRATA_EXPECTS(shortcut_.output_shape() == conv2_.output_shape(), "basic_block '", name,
                   "': shortcut and residual branch disagree on the output shape");
  }

  [[nodiscard]] const map_shape& input_shape() const noexcept { return conv1_.input_shape(); }
  [[nodiscard]] const map_shape& output_shape() const noexcept { return conv2_.output_shape(); }
  /// Sets both BN layers' γ = 1, β = 0 and resets their running statistics.
  void init(std::span<float> values) {
    bn1_.init(values);
    bn2_.init(values);
  }
  [[nodiscard]] batch_norm& bn1() noexcept { return bn1_; }
  [[nodiscard]] batch_norm& bn2() noexcept { return bn2_; }
  [[nodiscard]] const conv2d& conv1() const noexcept { return conv1_; }
  [[nodiscard]] const conv2d& conv2() const noexcept { return conv2_; }
  /// Sets both convolutions' engine (see conv2d::set_engine).
  void set_conv_engine(conv_engine engine) {
    conv1_.set_engine(engine);
    conv2_.set_engine(engine);
  }

  /// y ← block(x); x: (N·H·W) × Cin, y: (N·Ho·Wo) × Cout. Keeps views of nothing: the
  /// caller passes x and y again to backward.
  void forward(std::span<const float> params, matrix_view<const float> x, matrix_view<float> y,
               mode m, const stat_reducer& sync = {}) {
    const std::size_t batch = detail::batch_of("basic_block::forward", "x", x, input_shape());
    detail::expect_maps("basic_block::forward", "y", y, output_shape(), batch);
    const std::size_t rows = batch * output_shape().pixels();
    const std::size_t C = output_shape().channels;
    const auto c1 = c1_.view(rows, C);
    const auto r1 = r1_.view(rows, C);
    const auto c2 = c2_.view(rows, C);
    conv1_.forward(params, x, c1);
    bn1_.forward(params, c1, r1, m, sync, batch_norm::relu_rows);
    conv2_.forward(params, r1, c2);
    // BN, shortcut and ReLU in one pass over y, each row while it is in cache.
    bn2_.forward(params, c2, y, m, sync, [&](std::size_t first, matrix_view<float> rows) {
      for (std::size_t r = 0; r < rows.rows(); ++r)
        shortcut_.add_row(x, first + r, rows.row(r));
      batch_norm::relu_rows(first, rows);
    });
    batch_ = batch;
  }

  /// From dy = dL/dy of the last forward (same x and y): overwrites the block's gradients in
  /// `grads` and writes dx = dL/dx unless `dx` is null.
  void backward(std::span<const float> params, matrix_view<const float> x,
                matrix_view<const float> y, matrix_view<const float> dy, std::span<float> grads,
                matrix_view<float>* dx, const stat_reducer& sync = {}) {
    const std::size_t batch = detail::batch_of("basic_block::backward", "x", x, input_shape());
    detail::expect_maps("basic_block::backward", "y", y, output_shape(), batch);
    detail::expect_maps("basic_block::backward", "dy", dy, output_shape(), batch);
    if (dx != nullptr)
      detail::expect_maps("basic_block::backward", "dx", *dx, input_shape(), batch);
    if (batch != batch_)
      fail(errc::invalid_argument,
           cat("basic_block::backward: batch of ", batch, " but the last forward had ", batch_,
               "; call forward on the same batch first"));
    const std::size_t rows = batch * output_shape().pixels();
    const std::size_t C = output_shape().channels;
    const auto c1 = c1_.view(rows, C);
    const auto r1 = r1_.view(rows, C);
    const auto c2 = c2_.view(rows, C);
    const auto t = t_.view(rows, C);
    auto d = d_.view(rows, C);
    // The ReLUs' masks are fused into the passes that read their gradients: g = dy ⊙ [y > 0]
    // (dL/d(residual sum)) is made per block of rows inside bn2's passes and per row in the
    // shortcut's, and bn1's passes mask d by its output's sign recomputed from c1; no masked
    // copy is written.
    const auto g = [&](std::size_t first, std::size_t count, float* scratch) {
      const matrix_view<float> out(scratch, count, C);
      detail::as_eigen(out).array() =
          detail::relu_masked(detail::as_eigen(y.rows_slice(first, count)).array(),
                              detail::as_eigen(dy.rows_slice(first, count)).array());
      return matrix_view<const float>(out);
    };
    bn2_.backward(params, c2, g, grads, t, sync);                          // t = dL/dc2
    conv2_.backward(params, r1, t, grads, &d);                             // d = dL/dr1
    bn1_.backward(params, c1, bn1_.relu_gradient(c1, d), grads, d, sync);  // d = dL/dc1
    conv1_.backward(params, x, d, grads, dx);
    if (dx != nullptr) shortcut_.add_backward_through_relu(dy, y, *dx);
  }

 private:
  conv2d conv1_;
  batch_norm bn1_;
  conv2d conv2_;
  batch_norm bn2_;
  shortcut shortcut_;
  scratch c1_, r1_, c2_, t_, d_;
  std::size_t batch_ = static_cast<std::size_t>(-1);
};

}  // namespace strata::nn

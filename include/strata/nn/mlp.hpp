/// @file mlp.hpp
/// A stack of linear layers with ReLU between them, owning its activation buffers.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/activations.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/linear.hpp"
#include "strata/nn/parameters.hpp"

namespace strata::nn {

/// Multi-layer perceptron `sizes[0] → sizes[1] → … → sizes.back()`: linear layers named
/// "<name>.<l>", ReLU after every layer but the last, and after the last too when
/// `relu_last`. ReLU is fused into the linear layer's output (forward) and into the input
/// gradient of the next layer (backward).
///
/// forward() keeps a view of its input and the layer outputs for backward(): the caller keeps
/// the input alive until then. Activation buffers are reused across steps (no allocation once
/// the largest batch was seen). Cost: that of its linear layers. Not thread-safe (one mlp per
/// thread), though each call uses oneTBB internally.
class mlp {
 public:
  mlp() = default;
  mlp(parameter_set& params, std::span<const std::size_t> sizes, bool relu_last,
      const std::string& name)
      : relu_last_(relu_last) {
    for (const linear_blocks& blocks : add_mlp(params, sizes, name))
      layers_.emplace_back(blocks);
    acts_.resize(layers_.size());
    deltas_.resize(layers_.size());
  }

  [[nodiscard]] std::size_t in() const noexcept { return layers_.front().in(); }
  [[nodiscard]] std::size_t out() const noexcept { return layers_.back().out(); }
  [[nodiscard]] const std::vector<linear>& layers() const noexcept { return layers_; }
  /// Chooses the GEMM library of every layer (linear::set_engine).
  void set_gemm_engine(gemm_engine engine) {
    for (auto& layer : layers_)
      layer.set_engine(engine);
  }

  /// Runs the network on x (batch × in); returns the batch × out output (valid until the
  /// next forward).
  matrix_view<const float> forward(std::span<const float> params, matrix_view<const float> x) {
    detail::expect_shape("mlp::forward", "input", x, x.rows(), in());
    input_ = x;
    rows_ = x.rows();
    forwarded_ = true;
    matrix_view<const float> current = x;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const auto y = acts_[l].view(rows_, layers_[l].out());
      const bool relu_here = l + 1 < layers_.size() || relu_last_;
      layers_[l].forward(params, current, y, relu_here ? activation::relu : activation::none);
      current = y;
    }
    return current;
  }

  /// The output of the last forward (batch × out).
  [[nodiscard]] matrix_view<const float> output() { return acts_.back().view(rows_, out()); }

  /// From dy = dL/d(output) (batch × out), overwrites this MLP's blocks of `grads` and writes
  /// dx = dL/d(input) (batch × in).
  void backward(std::span<const float> params, matrix_view<const float> dy, std::span<float> grads,
                matrix_view<float> dx) {
    run_backward(params, dy, grads, &dx);
  }
  /// As above without the input gradient.
  void backward(std::span<const float> params, matrix_view<const float> dy,
                std::span<float> grads) {
    run_backward(params, dy, grads, nullptr);
  }

 private:
  void run_backward(std::span<const float> params, matrix_view<const float> dy,
                    std::span<float> grads, matrix_view<float>* dx) {
    if (!forwarded_)
      fail(errc::invalid_argument, "mlp::backward called before forward; run forward first");
    detail::expect_shape("mlp::backward", "dy", dy, rows_, out());
    if (dx != nullptr) detail::expect_shape("mlp::backward", "dx", *dx, rows_, in());
    const std::size_t last = layers_.size() - 1;
    matrix_view<const float> g = dy;
    if (relu_last_) {
      const auto masked = deltas_[last].view(rows_, out());
      relu::backward(acts_[last].view(rows_, out()), dy, masked);
      g = masked;
    }
    for (std::size_t l = last + 1; l-- > 0;) {
      if (l > 0) {
        const auto in_act = acts_[l - 1].view(rows_, layers_[l].in());
        const auto d = deltas_[l - 1].view(rows_, layers_[l].in());
        layers_[l].backward(params, in_act, g, grads, d, input_grad::through_relu);
        g = d;
      } else if (dx != nullptr) {
        layers_[0].backward(params, input_, g, grads, *dx, input_grad::plain);
      } else {
        layers_[0].backward(params, input_, g, grads);
      }
    }
  }

  std::vector<linear> layers_;
  bool relu_last_ = false;
  std::vector<scratch> acts_;
  std::vector<scratch> deltas_;
  matrix_view<const float> input_;
  std::size_t rows_ = 0;
  bool forwarded_ = false;
};

}  // namespace strata::nn

/// @file activations.hpp
/// Element-wise activations with explicit forward and backward: ReLU and sigmoid.
#pragma once

#include <cmath>
#include <cstddef>

#include "strata/core/matrix.hpp"
#include "strata/nn/common.hpp"

namespace strata::nn {

/// ReLU: y = max(x, 0); backward dx = dy ⊙ [y > 0] (the subgradient at 0 is 0).
/// Views may alias element-for-element (y may be x, dx may be dy). Cost: one pass; parallel
/// over fixed row blocks for batch ≥ 256 (row-independent, so deterministic). Stateless.
struct relu {
  static void forward(matrix_view<const float> x, matrix_view<float> y) {
    detail::expect_shape("relu::forward", "y", y, x.rows(), x.cols());
    detail::for_row_blocks(x.rows(), [&](std::size_t first, std::size_t count) {
      detail::as_eigen(y.rows_slice(first, count)) =
          detail::as_eigen(x.rows_slice(first, count)).cwiseMax(0.0f);
    });
  }
  /// `y` is the forward output.
  static void backward(matrix_view<const float> y, matrix_view<const float> dy,
                       matrix_view<float> dx) {
    detail::expect_shape("relu::backward", "dy", dy, y.rows(), y.cols());
    detail::expect_shape("relu::backward", "dx", dx, y.rows(), y.cols());
    detail::for_row_blocks(y.rows(), [&](std::size_t first, std::size_t count) {
      detail::as_eigen(dx.rows_slice(first, count)).array() =
          detail::relu_masked(detail::as_eigen(y.rows_slice(first, count)).array(),
                              detail::as_eigen(dy.rows_slice(first, count)).array());
    });
  }
};

/// Logistic sigmoid: y = 1 / (1 + exp(−x)), computed without overflow for any finite x
/// (exp is only taken of −|x|); backward dx = dy ⊙ y ⊙ (1 − y). Views may alias
/// element-for-element. Cost: one exp per value; parallel like relu. Stateless.
struct sigmoid {
  /// The sigmoid of one value, stable for large |x|.
  [[nodiscard]] static float value(float x) noexcept {
    const float e = std::exp(-std::abs(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
  }
  static void forward(matrix_view<const float> x, matrix_view<float> y) {
    detail::expect_shape("sigmoid::forward", "y", y, x.rows(), x.cols());
    detail::for_row_blocks(x.rows(), [&](std::size_t first, std::size_t count) {
      for (std::size_t r = first; r < first + count; ++r) {
        const auto in = x.row(r);
        const auto out = y.row(r);
        for (std::size_t c = 0; c < in.size(); ++c)
          out[c] = value(in[c]);
      }
    });
  }
  /// `y` is the forward output.
  static void backward(matrix_view<const float> y, matrix_view<const float> dy,
                       matrix_view<float> dx) {
    detail::expect_shape("sigmoid::backward", "dy", dy, y.rows(), y.cols());
    detail::expect_shape("sigmoid::backward", "dx", dx, y.rows(), y.cols());
    detail::for_row_blocks(y.rows(), [&](std::size_t first, std::size_t count) {
      const auto ye = detail::as_eigen(y.rows_slice(first, count)).array();
      detail::as_eigen(dx.rows_slice(first, count)).array() =
          detail::as_eigen(dy.rows_slice(first, count)).array() * ye * (1.0f - ye);
    });
  }
};

}  // namespace strata::nn

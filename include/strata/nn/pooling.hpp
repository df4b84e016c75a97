/// @file pooling.hpp
/// Max, average and global average pooling of NHWC batches, with explicit backward.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/conv2d.hpp"
#include "strata/nn/feature_map.hpp"

namespace strata::nn {

/// Max pooling over `w.kernel`² windows (padded positions never win; every window holds at
/// least one real pixel since padding < kernel): `y[n, oh, ow, c] = max_{kh, kw} x[n, oh·s + kh −
/// p, ow·s + kw − p, c]`; the first maximum in (kh, kw) order wins ties. Backward routes dy to the
/// winning input (kept from the last forward: one 32-bit index per output value). Cost: k²
/// comparisons per output; parallel over fixed sample chunks (deterministic). Stateful (winner
/// indices): not thread-safe.
class max_pool2d {
 public:
  max_pool2d() = default;
  max_pool2d(map_shape in, window w) : in_(in), window_(w) {
    STRATA_EXPECTS(in.pixels() > 0 && in.channels > 0, "max_pool2d: empty input shape");
    out_ = {w.output("max_pool2d", in.height), w.output("max_pool2d", in.width), in.channels};
  }
  [[nodiscard]] const map_shape& input_shape() const noexcept { return in_; }
  [[nodiscard]] const map_shape& output_shape() const noexcept { return out_; }

  void forward(matrix_view<const float> x, matrix_view<float> y) {
    const std::size_t batch = detail::batch_of("max_pool2d::forward", "x", x, in_);
    detail::expect_maps("max_pool2d::forward", "y", y, out_, batch);
    winner_.resize(y.size());
    batch_ = batch;
    const std::size_t C = in_.channels;
    detail::for_sample_chunks(
        batch, out_.pixels(), [&](std::size_t, std::size_t first, std::size_t count) {
          for (std::size_t n = first; n < first + count; ++n)
            for (std::size_t oh = 0; oh < out_.height; ++oh)
              for (std::size_t ow = 0; ow < out_.width; ++ow) {
                const std::size_t o = (n * out_.pixels() + oh * out_.width + ow) * C;
                float* best = y.data() + o;
                std::uint32_t* arg = winner_.data() + o;
                std::fill(best, best + C, -std::numeric_limits<float>::infinity());
                std::fill(arg, arg + C, 0u);
                for_window(oh, ow, [&](std::size_t pixel) {
                  const float* xs = x.data() + (n * in_.pixels() + pixel) * C;
                  for (std::size_t c = 0; c < C; ++c)
                    if (arg[c] == 0 || xs[c] > best[c]) {
                      best[c] = xs[c];
                      arg[c] = static_cast<std::uint32_t>(pixel + 1);
                    }
                });
              }
        });
  }

  /// dx ← dy routed to each window's winner (summed where windows overlap).
  void backward(matrix_view<const float> dy, matrix_view<float> dx) const {
    const std::size_t batch = detail::batch_of("max_pool2d::backward", "dy", dy, out_);
    detail::expect_maps("max_pool2d::backward", "dx", dx, in_, batch);
    if (batch != batch_ || winner_.size() != dy.size())
      fail(errc::invalid_argument,
           cat("max_pool2d::backward: dy holds ", batch, " samples but the last forward had ",
               batch_, "; call forward on the same batch first"));
    const std::size_t C = in_.channels;
    detail::for_sample_chunks(
        batch, in_.pixels(), [&](std::size_t, std::size_t first, std::size_t count) {
          std::fill(dx.data() + first * in_.size(), dx.data() + (first + count) * in_.size(), 0.0f);
          for (std::size_t n = first; n < first + count; ++n)
            for (std::size_t q = 0; q < out_.pixels(); ++q) {
              const std::size_t o = (n * out_.pixels() + q) * C;
              for (std::size_t c = 0; c < C; ++c)
                if (winner_[o + c] != 0)
                  dx.data()[(n * in_.pixels() + winner_[o + c] - 1) * C + c] += dy.data()[o + c];
            }
        });
  }

 private:
  template <class Fn>
  void for_window(std::size_t oh, std::size_t ow, Fn&& fn) const {
    const std::size_t k = window_.kernel, s = window_.stride, p = window_.padding;
    for (std::size_t kh = 0; kh < k; ++kh) {
      const std::size_t ih = oh * s + kh;
      if (ih < p || ih - p >= in_.height) continue;
      for (std::size_t kw = 0; kw < k; ++kw) {
        const std::size_t iw = ow * s + kw;
        if (iw < p || iw - p >= in_.width) continue;
        fn((ih - p) * in_.width + (iw - p));
      }
    }
  }

  map_shape in_{}, out_{};
  window window_{};
  std::vector<std::uint32_t> winner_;  // 1 + input pixel of each output value's maximum
  std::size_t batch_ = 0;
};

/// Average pooling over `w.kernel`² windows, zero padding counted in the divisor (PyTorch's
/// `count_include_pad=True`): `y = Σ_window x / k²`; backward spreads dy / k² over each
/// window. Cost: k² adds per output; parallel over fixed sample chunks. Stateless; const.
class avg_pool2d {
 public:
  avg_pool2d() = default;
  avg_pool2d(map_shape in, window w) : in_(in), window_(w) {
    STRATA_EXPECTS(in.pixels() > 0 && in.channels > 0, "avg_pool2d: empty input shape");
    out_ = {w.output("avg_pool2d", in.height), w.output("avg_pool2d", in.width), in.channels};
  }
  [[nodiscard]] const map_shape& input_shape() const noexcept { return in_; }
  [[nodiscard]] const map_shape& output_shape() const noexcept { return out_; }

  void forward(matrix_view<const float> x, matrix_view<float> y) const {
    const std::size_t batch = detail::batch_of("avg_pool2d::forward", "x", x, in_);
    detail::expect_maps("avg_pool2d::forward", "y", y, out_, batch);
    const std::size_t C = in_.channels;
    const float scale = 1.0f / static_cast<float>(window_.kernel * window_.kernel);
    detail::for_sample_chunks(batch, out_.pixels(),
                              [&](std::size_t, std::size_t first, std::size_t count) {
                                for (std::size_t n = first; n < first + count; ++n)
                                  for (std::size_t q = 0; q < out_.pixels(); ++q) {
                                    auto out = vec(y.data() + (n * out_.pixels() + q) * C, C);
                                    out.setZero();
                                    for_window(q, [&](std::size_t pixel) {
                                      out += cvec(x.data() + (n * in_.pixels() + pixel) * C, C);
                                    });
                                    out *= scale;
                                  }
                              });
  }

  void backward(matrix_view<const float> dy, matrix_view<float> dx) const {
    const std::size_t batch = detail::batch_of("avg_pool2d::backward", "dy", dy, out_);
    detail::expect_maps("avg_pool2d::backward", "dx", dx, in_, batch);
    const std::size_t C = in_.channels;
    const float scale = 1.0f / static_cast<float>(window_.kernel * window_.kernel);
    detail::for_sample_chunks(
        batch, in_.pixels(), [&](std::size_t, std::size_t first, std::size_t count) {
          std::fill(dx.data() + first * in_.size(), dx.data() + (first + count) * in_.size(), 0.0f);
          for (std::size_t n = first; n < first + count; ++n)
            for (std::size_t q = 0; q < out_.pixels(); ++q) {
              const auto g = cvec(dy.data() + (n * out_.pixels() + q) * C, C);
              for_window(q, [&](std::size_t pixel) {
                vec(dx.data() + (n * in_.pixels() + pixel) * C, C) += scale * g;
              });
            }
        });
  }

 private:
  static Eigen::Map<Eigen::VectorXf> vec(float* p, std::size_t n) {
    return {p, static_cast<Eigen::Index>(n)};
  }
  static Eigen::Map<const Eigen::VectorXf> cvec(const float* p, std::size_t n) {
    return {p, static_cast<Eigen::Index>(n)};
  }
  template <class Fn>
  void for_window(std::size_t q, Fn&& fn) const {
    const std::size_t oh = q / out_.width, ow = q % out_.width;
    const std::size_t k = window_.kernel, s = window_.stride, p = window_.padding;
    for (std::size_t kh = 0; kh < k; ++kh) {
      const std::size_t ih = oh * s + kh;
      if (ih < p || ih - p >= in_.height) continue;
      for (std::size_t kw = 0; kw < k; ++kw) {
        const std::size_t iw = ow * s + kw;
        if (iw < p || iw - p >= in_.width) continue;
        fn((ih - p) * in_.width + (iw - p));
      }
    }
  }

  map_shape in_{}, out_{};
  window window_{};
};

/// Global average pooling: NHWC maps (N·H·W) × C → N × C, `y[n, c] = mean_{h, w} x[n, h, w, c]`;
/// backward `dx[n, h, w, c] = dy[n, c] / (H·W)`. Cost: one pass; parallel over sample
/// chunks. Stateless; const.
class global_avg_pool {
 public:
  global_avg_pool() = default;
  explicit global_avg_pool(map_shape in) : in_(in) {
    STRATA_EXPECTS(in.pixels() > 0 && in.channels > 0, "global_avg_pool: empty input shape");
  }
  [[nodiscard]] const map_shape& input_shape() const noexcept { return in_; }

  /// x: (N·H·W) × C, y: N × C.
  void forward(matrix_view<const float> x, matrix_view<float> y) const {
    const std::size_t batch = detail::batch_of("global_avg_pool::forward", "x", x, in_);
    detail::expect_shape("global_avg_pool::forward", "y", y, batch, in_.channels);
    const float scale = 1.0f / static_cast<float>(in_.pixels());
    detail::for_sample_chunks(
        batch, in_.pixels(), [&](std::size_t, std::size_t first, std::size_t count) {
          for (std::size_t n = first; n < first + count; ++n)
            detail::as_eigen(y.rows_slice(n, 1)) =
                detail::as_eigen(x.rows_slice(n * in_.pixels(), in_.pixels())).colwise().sum() *
                scale;
        });
  }
  /// dy: N × C, dx: (N·H·W) × C.
  void backward(matrix_view<const float> dy, matrix_view<float> dx) const {
    const std::size_t batch = detail::batch_of("global_avg_pool::backward", "dx", dx, in_);
    detail::expect_shape("global_avg_pool::backward", "dy", dy, batch, in_.channels);
    const float scale = 1.0f / static_cast<float>(in_.pixels());
    detail::for_sample_chunks(
        batch, in_.pixels(), [&](std::size_t, std::size_t first, std::size_t count) {
          for (std::size_t n = first; n < first + count; ++n)
            detail::as_eigen(dx.rows_slice(n * in_.pixels(), in_.pixels())).rowwise() =
                detail::as_eigen(dy.rows_slice(n, 1)).row(0) * scale;
        });
  }

 private:
  map_shape in_{};
};

}  // namespace strata::nn

/// @file conv2d.hpp
/// 2-D convolution on NHWC batches — Winograd F(4×4, 3×3) for 3×3 stride-1 windows, oneDNN
/// primitives when the build has oneDNN, im2col + Eigen GEMM otherwise (and as the
/// reference) — with explicit backward.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include <tbb/enumerable_thread_specific.h>

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/detail/onednn_conv.hpp"
#include "strata/nn/detail/winograd_conv.hpp"
#include "strata/nn/feature_map.hpp"
#include "strata/nn/gemm.hpp"
#include "strata/nn/parameters.hpp"

namespace strata::nn {

/// Geometry of a convolution (or pooling) window: square `kernel`, `stride`, zero `padding`
/// on every side. Output size per axis: (in + 2·padding − kernel) / stride + 1.
struct window {
  std::size_t kernel = 3;
  std::size_t stride = 1;
  std::size_t padding = 1;

  /// Output extent of an input extent `in`; throws when the window does not fit.
  [[nodiscard]] std::size_t output(std::string_view where, std::size_t in) const {
    STRATA_EXPECTS(kernel > 0 && stride > 0, where, ": kernel and stride must be positive, got ",
                   kernel, " and ", stride);
    STRATA_EXPECTS(padding < kernel, where, ": padding ", padding, " must be smaller than kernel ",
                   kernel);
    STRATA_EXPECTS(in + 2 * padding >= kernel, where, ": a ", kernel, "-wide window with padding ",
                   padding, " does not fit an input of extent ", in);
    return (in + 2 * padding - kernel) / stride + 1;
  }
};

/// How a conv2d computes: oneDNN's convolution primitives (direct, JIT-compiled for this
/// machine's ISA), im2col + Eigen GEMM (every build; the reference the tests compare with), or
/// Winograd's F(4×4, 3×3) with Eigen GEMMs (every build) for 3×3 stride-1 padding-1 windows —
/// other windows then run on oneDNN when the build has it, else on im2col.
enum class conv_engine { onednn, im2col, winograd };

/// The engine a new conv2d uses: Winograd (on ResNet-20's 3×3 stride-1 layers 1.3–1.45× the
/// speed of oneDNN's direct kernels with two threads, docs/resnet.md), with the other windows
/// on oneDNN when available.
inline constexpr conv_engine default_conv_engine = conv_engine::winograd;

/// Name of an engine ("onednn", "im2col", "winograd").
constexpr std::string_view to_string(conv_engine e) noexcept {
  switch (e) {
    case conv_engine::onednn:
      return "onednn";
    case conv_engine::im2col:
      return "im2col";
    case conv_engine::winograd:
      return "winograd";
  }
  return "unknown";
}

/// 2-D convolution (cross-correlation, as in every DL framework) of NHWC batches:
/// ```
/// y[n, oh, ow, o] = b[o] + Σ_{kh, kw, c} W[o, kh, kw, c] · x[n, oh·s + kh − p, ow·s + kw − p, c]
/// ```
/// (x is 0 outside the map). W is Cout × (k·k·Cin) row-major — PyTorch's OIHW weight permuted
/// to OHWI — registered as "<name>.weight" (fan_in_uniform: U(±1/sqrt(k·k·Cin)), PyTorch's
/// default conv init); the optional bias is "<name>.bias".
///
/// Engines (`set_engine`; default `default_conv_engine`). All split the batch into the same
/// fixed chunks of whole samples (≈1024 output pixels) run on oneTBB, one task per chunk:
///
/// * Winograd (3×3 window, stride 1, padding 1; `nn/detail/winograd_conv.hpp`): each chunk's
///   4×4 output tiles as 36 Eigen GEMMs between transformed 6×6 input tiles and transformed
///   weights (4× fewer multiply-adds than direct), backward as the exact gradient of that;
///   the weights are transformed once per call. Layers of another geometry use oneDNN when
///   the build has it, else im2col (`runs_winograd` says which).
/// * oneDNN: each chunk is one single-threaded call of oneDNN's forward / backward-data /
///   backward-weights primitive on the chunk's sub-batch (NHWC in place; the weights are
///   reordered once per call into the layout the primitive wants). Primitives are created on
///   first use per sub-batch size and cached in the layer. Where oneDNN has only its
///   reference kernel for a shape, the layer computes that shape with im2col.
/// * im2col + GEMM. For each fixed chunk of samples (≈1024 output pixels) the patches
/// are copied into a (pixels × k·k·Cin) matrix — in NHWC each patch row is k contiguous runs
/// of k·Cin (stride 1) or Cin values, so im2col is a few memcpy per pixel — and one Eigen
/// GEMM `Y = col · Wᵀ` writes the NHWC output directly (no transpose). Backward recomputes
/// the chunk's col (cheaper than keeping the whole batch's: 9× the input), then
/// `dW_chunk = dYᵀ · col` and `dcol = dY · W`, scattered back by col2im.
///
/// Cost: forward 2·N·Ho·Wo·Cout·k²·Cin flops; backward twice that (half without dx). Chunks
/// run in parallel on oneTBB; the split depends on the shape only and the per-chunk dW
/// partials are summed in chunk order, so results are bitwise identical whatever the thread
/// count. Holds per-thread im2col scratch: one layer object must not run two calls at once.
class conv2d {
 public:
  conv2d() = default;
  /// Registers the layer's blocks in `params`: `in` maps → `out_channels` maps through a
  /// `w.kernel`² window.
  conv2d(parameter_set& params, map_shape in, std::size_t out_channels, window w, bool bias,
         const std::string& name)
      : in_(in), window_(w), bias_(bias), name_(name) {
    STRATA_EXPECTS(in.height > 0 && in.width > 0 && in.channels > 0 && out_channels > 0, "conv2d '",
                   name, "': sizes must be positive, got ", in.height, "x", in.width, "x",
                   in.channels, " -> ", out_channels, " channels");
    out_ = {w.output("conv2d '" + name + "'", in.height),
            w.output("conv2d '" + name + "'", in.width), out_channels};
    const std::size_t fan_in = patch();
    weight_offset_ = params.add(name + ".weight", out_channels * fan_in,
                                init_scheme::fan_in_uniform, fan_in, out_channels);
    if (bias_)
      bias_offset_ = params.add(name + ".bias", out_channels, init_scheme::fan_in_uniform, fan_in,
                                out_channels);
    if (detail::winograd_conv::applies(w.kernel, w.stride, w.padding))
      winograd_ = detail::winograd_conv(in_, out_channels);
#ifdef STRATA_HAS_ONEDNN
    onednn_ = detail::onednn_conv({.in = in_,
                                   .out = out_,
                                   .kernel = w.kernel,
                                   .stride = w.stride,
                                   .padding = w.padding,
                                   .bias = bias_});
#endif
  }

  /// Chooses how this layer computes. Throws `errc::unsupported` for oneDNN in a build
  /// without it.
  void set_engine(conv_engine engine) {
    if (engine == conv_engine::onednn && !onednn_available)
      fail(errc::unsupported,
           cat("conv2d '", name_,
               "': this build has no oneDNN; install libdnnl-dev and reconfigure (CMake finds it "
               "unless STRATA_ONEDNN=OFF), or use conv_engine::im2col"));
    engine_ = engine;
  }
  /// The engine chosen with `set_engine` (shapes oneDNN cannot run well still use im2col, see
  /// `runs_onednn`; windows Winograd does not cover use another engine, see `runs_winograd`).
  [[nodiscard]] conv_engine engine() const noexcept {
    return engine_;
  }
  /// True when a batch of `batch` samples runs on oneDNN's primitives.
  [[nodiscard]] bool runs_onednn(std::size_t batch) const {
    return uses_onednn(batch);
  }
  /// True when this layer computes with Winograd (engine chosen, 3×3 stride-1 padding-1).
  [[nodiscard]] bool runs_winograd() const noexcept {
    return engine_ == conv_engine::winograd && winograd_applies();
  }

  [[nodiscard]] const map_shape& input_shape() const noexcept {
    return in_;
  }
  [[nodiscard]] const map_shape& output_shape() const noexcept {
    return out_;
  }
  [[nodiscard]] const window& geometry() const noexcept {
    return window_;
  }
  /// Values per patch: k·k·Cin (the GEMM's inner dimension).
  [[nodiscard]] std::size_t patch() const noexcept {
    return window_.kernel * window_.kernel * in_.channels;
  }
  [[nodiscard]] bool has_bias() const noexcept {
    return bias_;
  }
  /// W as a Cout × (k·k·Cin) view into a flat buffer (values or gradients).
  template <class T>
  [[nodiscard]] matrix_view<T> weight(std::span<T> flat) const {
    check_flat(flat.size());
    return {flat.data() + weight_offset_, out_.channels, patch()};
  }
  /// b (Cout values) in a flat buffer; empty without bias.
  template <class T>
  [[nodiscard]] std::span<T> bias(std::span<T> flat) const {
    check_flat(flat.size());
    return bias_ ? flat.subspan(bias_offset_, out_.channels) : std::span<T>{};
  }

  /// y ← conv(x) (+ b). x: (N·H·W) × Cin, y: (N·Ho·Wo) × Cout, both contiguous NHWC.
  void forward(std::span<const float> params, matrix_view<const float> x,
               matrix_view<float> y) const {
    const std::size_t batch = detail::batch_of("conv2d::forward", "x", x, in_);
    detail::expect_maps("conv2d::forward", "y", y, out_, batch);
    if (runs_winograd()) {
      winograd_.load_weights(weight(params).data());
      const float* b = bias_ ? bias(params).data() : nullptr;
      detail::for_sample_chunks(batch, out_.pixels(),
                                [&](std::size_t, std::size_t first, std::size_t count) {
                                  winograd_.forward(x.data() + first * in_.size(), b,
                                                    y.data() + first * out_.size(), count);
                                });
      return;
    }
#ifdef STRATA_HAS_ONEDNN
    if (uses_onednn(batch)) {
      onednn_.load_forward_weights(weight(params).data(), full_chunk(batch));
      const float* b = bias_ ? bias(params).data() : nullptr;
      detail::for_sample_chunks(batch, out_.pixels(),
                                [&](std::size_t, std::size_t first, std::size_t count) {
                                  onednn_.forward(x.data() + first * in_.size(), b,
                                                  y.data() + first * out_.size(), count);
                                });
      return;
    }
#endif
    const auto w = detail::as_eigen(weight(params));
    const auto b = detail::as_vector(bias(params));
    detail::for_sample_chunks(
        batch, out_.pixels(), [&](std::size_t, std::size_t first, std::size_t count) {
          const std::size_t rows = count * out_.pixels();
          auto col = im2col(x, first, count);
          auto ye = detail::as_eigen(y.rows_slice(first * out_.pixels(), rows));
          ye.noalias() = col * w.transpose();
          if (bias_) ye.rowwise() += b.transpose();
        });
  }

  /// Overwrites this layer's dW (and db) in `grads` from dy = dL/dy, and writes
  /// dx = dL/dx unless `dx` is null (the network's first layer).
  void backward(std::span<const float> params, matrix_view<const float> x,
                matrix_view<const float> dy, std::span<float> grads, matrix_view<float>* dx) const {
    const std::size_t batch = detail::batch_of("conv2d::backward", "x", x, in_);
    detail::expect_maps("conv2d::backward", "dy", dy, out_, batch);
    if (dx != nullptr) detail::expect_maps("conv2d::backward", "dx", *dx, in_, batch);
    if (runs_winograd()) {
      backward_winograd(params, x, dy, grads, dx, batch);
      return;
    }
#ifdef STRATA_HAS_ONEDNN
    if (uses_onednn(batch)) {
      backward_onednn(params, x, dy, grads, dx, batch);
      return;
    }
#endif
    const auto w = detail::as_eigen(weight(params));
    auto dw = detail::as_eigen(weight(grads));
    auto db = detail::as_vector(bias(grads));
    const std::size_t chunks = detail::sample_chunks(batch, out_.pixels());
    const std::size_t per_chunk = out_.channels * (patch() + (bias_ ? 1 : 0));
    if (partials_.size() < chunks * per_chunk)
      partials_ = aligned_buffer<float>(chunks * per_chunk);
    detail::for_sample_chunks(
        batch, out_.pixels(), [&](std::size_t c, std::size_t first, std::size_t count) {
          const std::size_t rows = count * out_.pixels();
          const auto dye = detail::as_eigen(dy.rows_slice(first * out_.pixels(), rows));
          float* part = partials_.data() + c * per_chunk;
          Eigen::Map<detail::row_major_matrix<float>> pw(
              part, static_cast<Eigen::Index>(out_.channels), static_cast<Eigen::Index>(patch()));
          {
            const auto col = im2col(x, first, count);
            pw.noalias() = dye.transpose() * col;
          }
          if (bias_)
            Eigen::Map<Eigen::VectorXf>(part + out_.channels * patch(),
                                        static_cast<Eigen::Index>(out_.channels))
                .noalias() = dye.colwise().sum().transpose();
          if (dx != nullptr) {
            auto dcol = scratch_view(dcol_, rows);
            dcol.noalias() = dye * w;
            col2im(dcol, *dx, first, count);
          }
        });
    // dW = Σ_chunks partial, in chunk order (deterministic).
    Eigen::Map<const Eigen::VectorXf> first_part(partials_.data(),
                                                 static_cast<Eigen::Index>(per_chunk));
    Eigen::VectorXf total = first_part;
    for (std::size_t c = 1; c < chunks; ++c)
      total += Eigen::Map<const Eigen::VectorXf>(partials_.data() + c * per_chunk,
                                                 static_cast<Eigen::Index>(per_chunk));
    if (chunks == 0) total.setZero();
    dw = Eigen::Map<const detail::row_major_matrix<float>>(
        total.data(), static_cast<Eigen::Index>(out_.channels), static_cast<Eigen::Index>(patch()));
    if (bias_) db = total.tail(static_cast<Eigen::Index>(out_.channels));
  }

 private:
  /// Samples in the first (full) chunk of a batch of `batch`.
  [[nodiscard]] std::size_t full_chunk(std::size_t batch) const noexcept {
    return std::min(batch, detail::samples_per_task(out_.pixels()));
  }

  [[nodiscard]] bool winograd_applies() const noexcept {
    return detail::winograd_conv::applies(window_.kernel, window_.stride, window_.padding);
  }

  [[nodiscard]] bool uses_onednn([[maybe_unused]] std::size_t batch) const {
#ifdef STRATA_HAS_ONEDNN
    const bool wanted =
        engine_ == conv_engine::onednn || (engine_ == conv_engine::winograd && !winograd_applies());
    if (!wanted || batch == 0) return false;
    const std::size_t full = full_chunk(batch);
    return onednn_.prepare(full, batch % full);
#else
    return false;
#endif
  }

  void backward_winograd(std::span<const float> params, matrix_view<const float> x,
                         matrix_view<const float> dy, std::span<float> grads,
                         matrix_view<float>* dx, std::size_t batch) const {
    const std::size_t chunks = detail::sample_chunks(batch, out_.pixels());
    if (chunks == 0) {  // an empty batch: zero gradients
      const auto dw = weight(grads);
      std::fill_n(dw.data(), dw.rows() * dw.cols(), 0.0f);
      std::ranges::fill(bias(grads), 0.0f);
      return;
    }
    const std::size_t transformed = winograd_.transformed_floats();
    const std::size_t per_chunk = transformed + (bias_ ? out_.channels : 0);
    if (partials_.size() < chunks * per_chunk)
      partials_ = aligned_buffer<float>(chunks * per_chunk);
    if (dx != nullptr) winograd_.load_weights(weight(params).data());
    detail::for_sample_chunks(
        batch, out_.pixels(), [&](std::size_t c, std::size_t first, std::size_t count) {
          float* part = partials_.data() + c * per_chunk;
          winograd_.backward(x.data() + first * in_.size(), dy.data() + first * out_.size(),
                             dx != nullptr ? dx->data() + first * in_.size() : nullptr, part,
                             bias_ ? part + transformed : nullptr, count);
        });
    // dU, db = Σ_chunks partial, in chunk order (deterministic), then dW = Gᵀ dU G.
    Eigen::Map<Eigen::VectorXf> total(partials_.data(), static_cast<Eigen::Index>(per_chunk));
    for (std::size_t c = 1; c < chunks; ++c)
      total += Eigen::Map<const Eigen::VectorXf>(partials_.data() + c * per_chunk,
                                                 static_cast<Eigen::Index>(per_chunk));
    winograd_.store_weight_gradient(total.data(), weight(grads).data());
    if (bias_) {
      auto db = bias(grads);
      std::copy_n(total.data() + transformed, out_.channels, db.begin());
    }
  }

#ifdef STRATA_HAS_ONEDNN
  void backward_onednn(std::span<const float> params, matrix_view<const float> x,
                       matrix_view<const float> dy, std::span<float> grads, matrix_view<float>* dx,
                       std::size_t batch) const {
    const std::size_t full = full_chunk(batch);
    const std::size_t chunks = detail::sample_chunks(batch, out_.pixels());
    const std::size_t weight_floats = onednn_.diff_weight_floats(full);
    const std::size_t per_chunk = weight_floats + (bias_ ? out_.channels : 0);
    if (partials_.size() < chunks * per_chunk)
      partials_ = aligned_buffer<float>(chunks * per_chunk);
    if (dx != nullptr) onednn_.load_backward_data_weights(weight(params).data(), full);
    detail::for_sample_chunks(
        batch, out_.pixels(), [&](std::size_t c, std::size_t first, std::size_t count) {
          float* part = partials_.data() + c * per_chunk;
          const float* dy_chunk = dy.data() + first * out_.size();
          onednn_.backward_weights(x.data() + first * in_.size(), dy_chunk, part,
                                   part + weight_floats, count);
          if (dx != nullptr)
            onednn_.backward_data(dy_chunk, dx->data() + first * in_.size(), count);
        });
    // dW, db = Σ_chunks partial, in chunk order (deterministic), then into OHWI.
    Eigen::Map<Eigen::VectorXf> total(partials_.data(), static_cast<Eigen::Index>(per_chunk));
    for (std::size_t c = 1; c < chunks; ++c)
      total += Eigen::Map<const Eigen::VectorXf>(partials_.data() + c * per_chunk,
                                                 static_cast<Eigen::Index>(per_chunk));
    onednn_.store_weight_gradient(total.data(), weight(grads).data(), full);
    if (bias_) {
      auto db = bias(grads);
      std::copy_n(total.data() + weight_floats, out_.channels, db.begin());
    }
  }
#endif

  using eigen_rows = Eigen::Map<detail::row_major_matrix<float>, Eigen::Aligned64>;

  /// This thread's rows × patch() scratch matrix (grown on demand).
  eigen_rows scratch_view(tbb::enumerable_thread_specific<aligned_buffer<float>>& store,
                          std::size_t rows) const {
    auto& buffer = store.local();
    if (buffer.size() < rows * patch()) buffer = aligned_buffer<float>(rows * patch());
    return {buffer.data(), static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(patch())};
  }

  /// Patches of samples [first, first + count) as a (count·Ho·Wo) × patch() matrix in this
  /// thread's scratch; columns ordered (kh, kw, c).
  eigen_rows im2col(matrix_view<const float> x, std::size_t first, std::size_t count) const {
    const std::size_t rows = count * out_.pixels();
    auto col = scratch_view(col_, rows);
    const std::size_t k = window_.kernel, s = window_.stride, p = window_.padding;
    const std::size_t C = in_.channels, H = in_.height, W = in_.width, K = patch();
    float* out = col.data();
    for (std::size_t n = 0; n < count; ++n) {
      const float* xs = x.data() + (first + n) * in_.size();
      for (std::size_t oh = 0; oh < out_.height; ++oh)
        for (std::size_t ow = 0; ow < out_.width; ++ow, out += K) {
          // Valid kernel columns: 0 <= ow·s + kw − p < W.
          const std::size_t base_w = ow * s;
          const std::size_t kw0 = base_w >= p ? 0 : p - base_w;
          const std::size_t kw1 = std::min(k, W + p - base_w);
          for (std::size_t kh = 0; kh < k; ++kh) {
            float* dst = out + kh * k * C;
            const std::size_t ih_p = oh * s + kh;  // ih + p
            if (ih_p < p || ih_p - p >= H || kw0 >= kw1) {
              std::fill(dst, dst + k * C, 0.0f);
              continue;
            }
            const float* src = xs + ((ih_p - p) * W + (base_w + kw0 - p)) * C;
            std::fill(dst, dst + kw0 * C, 0.0f);
            std::memcpy(dst + kw0 * C, src, (kw1 - kw0) * C * sizeof(float));
            std::fill(dst + kw1 * C, dst + k * C, 0.0f);
          }
        }
    }
    return col;
  }

  /// Adds the patch gradients `dcol` of samples [first, first + count) into dx (overwritten
  /// first for those samples).
  void col2im(const eigen_rows& dcol, matrix_view<float> dx, std::size_t first,
              std::size_t count) const {
    const std::size_t k = window_.kernel, s = window_.stride, p = window_.padding;
    const std::size_t C = in_.channels, H = in_.height, W = in_.width, K = patch();
    const float* in = dcol.data();
    for (std::size_t n = 0; n < count; ++n) {
      float* xs = dx.data() + (first + n) * in_.size();
      std::fill(xs, xs + in_.size(), 0.0f);
      for (std::size_t oh = 0; oh < out_.height; ++oh)
        for (std::size_t ow = 0; ow < out_.width; ++ow, in += K) {
          const std::size_t base_w = ow * s;
          const std::size_t kw0 = base_w >= p ? 0 : p - base_w;
          const std::size_t kw1 = std::min(k, W + p - base_w);
          for (std::size_t kh = 0; kh < k; ++kh) {
            const std::size_t ih_p = oh * s + kh;
            if (ih_p < p || ih_p - p >= H || kw0 >= kw1) continue;
            float* dst = xs + ((ih_p - p) * W + (base_w + kw0 - p)) * C;
            const float* src = in + (kh * k + kw0) * C;
            const std::size_t len = (kw1 - kw0) * C;
            // Consecutive kw are consecutive pixels (whatever the stride): one run each side.
            Eigen::Map<Eigen::VectorXf>(dst, static_cast<Eigen::Index>(len)) +=
                Eigen::Map<const Eigen::VectorXf>(src, static_cast<Eigen::Index>(len));
          }
        }
    }
  }

  void check_flat(std::size_t size) const {
    const std::size_t end =
        bias_ ? bias_offset_ + out_.channels : weight_offset_ + out_.channels * patch();
    if (size < end)
      fail(errc::size_mismatch, cat("conv2d: flat parameter buffer of ", size,
                                    " values is too small for a layer ending at ", end,
                                    "; pass the model's whole buffer"));
  }

  map_shape in_{};
  map_shape out_{};
  window window_{};
  bool bias_ = false;
  std::size_t weight_offset_ = 0;
  std::size_t bias_offset_ = 0;
  mutable tbb::enumerable_thread_specific<aligned_buffer<float>> col_;
  mutable tbb::enumerable_thread_specific<aligned_buffer<float>> dcol_;
  mutable aligned_buffer<float> partials_;
  conv_engine engine_ = default_conv_engine;
  std::string name_;
  detail::winograd_conv winograd_;
#ifdef STRATA_HAS_ONEDNN
  mutable detail::onednn_conv onednn_{detail::conv_geometry{}};
#endif
};

}  // namespace strata::nn

/// @file resnet.hpp
/// CIFAR-style ResNet-(6n+2) (He et al., 2016, §4.2) for small images such as Fashion-MNIST,
/// on NHWC batches, with explicit backward and all parameters in one flat buffer.
///
/// ```cpp
/// strata::models::resnet net({.blocks_per_stage = 3});        // ResNet-20, 1x28x28 -> 10
/// net.forward(images, logits);                                 // images N x 784, logits N x 10
/// nn::softmax_cross_entropy(logits, labels, dlogits, 1.0f / N);
/// net.backward(dlogits);                                       // fills net.gradients()
/// opt.step(net.parameters(), net.gradients());
/// ```
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/batch_norm.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/conv2d.hpp"
#include "strata/nn/feature_map.hpp"
#include "strata/nn/linear.hpp"
#include "strata/nn/parameters.hpp"
#include "strata/nn/pooling.hpp"
#include "strata/nn/residual.hpp"

namespace strata::models {

/// ResNet for H × W × C images (default 28 × 28 × 1, 10 classes):
/// ```
/// x0 = relu(bn(conv3x3(image)))                       // width w0
/// stage s = 0, 1, 2: n basic blocks of width w_s;      // first block of stages 1, 2: stride 2
///                    option-A shortcuts (subsample + zero channels), no projection
/// logits = linear(global_avg_pool(x))                  // w2 -> classes
/// ```
/// Depth 6n + 2 (n = 3: ResNet-20, 0.27 M parameters). Parameters: stem conv, stem BN, the
/// blocks in order (see nn::basic_block), fc weight and bias — one nn::parameter_set seeded by
/// `config::seed` (conv U(±1/sqrt(fan_in)), BN γ = 1, β = 0, fc as nn::linear), identical on
/// every rank for the same seed.
///
/// Batch norm follows `set_mode` (train: batch statistics, running statistics updated; eval:
/// running statistics). `set_bn_sync(reducer)` makes every BN layer allreduce its per-batch
/// sums in training mode (forward and backward), so data-parallel workers normalise with the
/// global batch's statistics: N workers on shards equal one worker on the global batch.
///
/// Cost per image (28 × 28, widths 16/32/64): ≈ 21·n MFLOP forward (n = 3: 63 MFLOP), ≈ 3×
/// that for a training step. Kept for backward: about 4 maps per block (input, two BN inputs,
/// ReLU output) — ≈ 4·n·(784·16 + 196·32 + 49·64) floats ≈ 0.3·n MB per 28 × 28 image. oneTBB
/// inside; bitwise identical results whatever the thread count. Not thread-safe: one model per
/// worker.
class resnet {
 public:
  struct config {
    std::size_t blocks_per_stage = 3;                  ///< n: depth 6n + 2
    std::array<std::size_t, 3> widths = {16, 32, 64};  ///< channels of the three stages
    nn::map_shape input = {28, 28, 1};                 ///< image height, width, channels
    std::size_t classes = 10;
    float bn_momentum = 0.1f;
    float bn_eps = 1e-5f;
    std::uint64_t seed = 0;  ///< initialisation seed of the parameters
    /// How the convolutions compute (nn::conv_engine; `set_conv_engine` changes it later).
    nn::conv_engine conv = nn::default_conv_engine;
  };

  resnet() : resnet(config{}) {}
  explicit resnet(const config& c) : config_(c) {
    STRATA_EXPECTS(c.blocks_per_stage >= 1, "resnet::config: blocks_per_stage (n) must be >= 1");
    STRATA_EXPECTS(c.input.pixels() > 0 && c.input.channels > 0,
                   "resnet::config: input shape must be positive");
    STRATA_EXPECTS(c.classes >= 2, "resnet::config: needs at least 2 classes, got ", c.classes);
    for (std::size_t s = 0; s < 3; ++s)
      STRATA_EXPECTS(c.widths[s] > 0 && (s == 0 || c.widths[s] >= c.widths[s - 1]),
                     "resnet::config: widths must be positive and non-decreasing (option-A "
                     "shortcuts pad channels), got ",
                     c.widths[0], "/", c.widths[1], "/", c.widths[2]);
    stem_ = nn::conv2d(params_, c.input, c.widths[0], {3, 1, 1}, false, "stem.conv");
    stem_bn_ = nn::batch_norm(params_, c.widths[0], "stem.bn", c.bn_momentum, c.bn_eps);
    nn::map_shape shape = stem_.output_shape();
    for (std::size_t s = 0; s < 3; ++s)
      for (std::size_t b = 0; b < c.blocks_per_stage; ++b) {
        const std::size_t stride = s > 0 && b == 0 ? 2 : 1;
        blocks_.emplace_back(params_, shape, c.widths[s], stride,
                             cat("stage", s + 1, ".block", b + 1), c.bn_momentum, c.bn_eps);
        shape = blocks_.back().output_shape();
      }
    pool_ = nn::global_avg_pool(shape);
    fc_ = nn::linear(params_, shape.channels, c.classes, "fc");
    acts_.resize(blocks_.size() + 1);
    params_.allocate(c.seed);
    init_batch_norm();
    set_conv_engine(c.conv);
  }

  // Layers keep no pointers into the model, but blocks hold thread-local scratch: no copies.
  resnet(const resnet&) = delete;
  resnet& operator=(const resnet&) = delete;
  resnet(resnet&&) = default;
  resnet& operator=(resnet&&) = default;

  [[nodiscard]] const config& settings() const noexcept { return config_; }
  [[nodiscard]] std::size_t depth() const noexcept { return 6 * config_.blocks_per_stage + 2; }
  /// Input values per image: height · width · channels (row of `forward`'s images).
  [[nodiscard]] std::size_t input_size() const noexcept { return config_.input.size(); }
  [[nodiscard]] std::size_t classes() const noexcept { return config_.classes; }
  [[nodiscard]] std::span<float> parameters() noexcept { return params_.values(); }
  [[nodiscard]] std::span<float> gradients() noexcept { return params_.grads(); }
  [[nodiscard]] const nn::parameter_set& parameter_set() const noexcept { return params_; }

  /// Train (batch statistics) or eval (running statistics) for every BN layer.
  void set_mode(nn::mode m) noexcept { mode_ = m; }
  [[nodiscard]] nn::mode mode() const noexcept { return mode_; }
  /// Sets every convolution's engine (nn::conv_engine; by default Winograd for the 3×3
  /// stride-1 convolutions — all but the two stride-2 ones — and those two on oneDNN when the
  /// build has it, else on im2col + Eigen); throws `errc::unsupported` for oneDNN without it.
  void set_conv_engine(nn::conv_engine engine) {
    stem_.set_engine(engine);
    for (auto& block : blocks_)
      block.set_conv_engine(engine);
  }
  /// Sums BN statistics over workers in training mode (empty: per-worker statistics).
  void set_bn_sync(nn::stat_reducer reducer) { sync_ = std::move(reducer); }

  /// Re-initialises parameters from `seed`, BN γ = 1, β = 0 and the running statistics.
  void reset(std::uint64_t seed) {
    params_.reset(seed);
    init_batch_norm();
  }

  /// Every BN layer's running mean then running variance, layer by layer (for checkpoints or
  /// a broadcast from rank 0).
  [[nodiscard]] std::vector<float> running_statistics() {
    std::vector<float> out;
    for_each_bn([&](nn::batch_norm& bn) {
      out.insert(out.end(), bn.running_mean().begin(), bn.running_mean().end());
      out.insert(out.end(), bn.running_var().begin(), bn.running_var().end());
    });
    return out;
  }
  /// Loads what running_statistics() returned.
  void set_running_statistics(std::span<const float> values) {
    std::size_t need = 0;
    for_each_bn([&](nn::batch_norm& bn) { need += 2 * bn.channels(); });
    if (values.size() != need)
      fail(errc::size_mismatch, cat("resnet::set_running_statistics: got ", values.size(),
                                    " values but the model's BN layers hold ", need));
    std::size_t at = 0;
    for_each_bn([&](nn::batch_norm& bn) {
      std::ranges::copy(values.subspan(at, bn.channels()), bn.running_mean().begin());
      at += bn.channels();
      std::ranges::copy(values.subspan(at, bn.channels()), bn.running_var().begin());
      at += bn.channels();
    });
  }

  /// logits ← net(images). images: N × (H·W·C) (NHWC pixels of each image in a row; for one
  /// channel, plain row-major images), contiguous; logits: N × classes. Keeps a view of
  /// `images` for backward: keep it alive and unchanged until then.
  void forward(matrix_view<const float> images, matrix_view<float> logits) {
    if (images.cols() != input_size() || !images.contiguous())
      fail(errc::size_mismatch,
           cat("resnet::forward: images are ", images.rows(), " x ", images.cols(),
               images.contiguous() ? "" : " (strided)", " but must be a contiguous N x ",
               input_size(), " matrix (", config_.input.height, "x", config_.input.width, "x",
               config_.input.channels, " NHWC pixels per row)"));
    const std::size_t n = images.rows();
    nn::detail::expect_shape("resnet::forward", "logits", logits, n, config_.classes);
    STRATA_EXPECTS(n > 0, "resnet::forward: empty batch");
    batch_ = n;
    images_ = {images.data(), n * config_.input.pixels(), config_.input.channels};
    const nn::map_shape s0 = stem_.output_shape();
    const auto c0 = stem_out_.view(n * s0.pixels(), s0.channels);
    auto x = acts_[0].view(n * s0.pixels(), s0.channels);
    stem_.forward(params_.values(), images_, c0);
    stem_bn_.forward(params_.values(), c0, x, mode_, sync_, nn::batch_norm::relu_rows);
    for (std::size_t b = 0; b < blocks_.size(); ++b) {
      const nn::map_shape& o = blocks_[b].output_shape();
      auto y = acts_[b + 1].view(n * o.pixels(), o.channels);
      blocks_[b].forward(params_.values(), x, y, mode_, sync_);
      x = y;
    }
    const auto pooled = pooled_.view(n, fc_.in());
    pool_.forward(x, pooled);
    fc_.forward(params_.values(), pooled, logits);
    backward_ready_ = true;
  }

  /// From dlogits = dL/dlogits (N × classes) of the last forward: overwrites gradients().
  void backward(matrix_view<const float> dlogits) {
    if (!backward_ready_)
      fail(errc::invalid_argument,
           "resnet::backward: no forward to differentiate; call "
           "forward first (once per backward)");
    nn::detail::expect_shape("resnet::backward", "dlogits", dlogits, batch_, config_.classes);
    backward_ready_ = false;
    const std::size_t n = batch_;
    auto grads = params_.grads();
    const auto values = params_.values();
    const auto pooled = pooled_.view(n, fc_.in());
    const auto dpooled = dpooled_.view(n, fc_.in());
    fc_.backward(values, pooled, dlogits, grads, dpooled);
    const nn::map_shape& last = blocks_.back().output_shape();
    auto dy = ping_.view(n * last.pixels(), last.channels);
    pool_.backward(dpooled, dy);
    for (std::size_t b = blocks_.size(); b-- > 0;) {
      const nn::map_shape& in = blocks_[b].input_shape();
      const nn::map_shape& out = blocks_[b].output_shape();
      auto& next = (blocks_.size() - b) % 2 == 1 ? pong_ : ping_;
      auto dx = next.view(n * in.pixels(), in.channels);
      blocks_[b].backward(values, acts_[b].view(n * in.pixels(), in.channels),
                          acts_[b + 1].view(n * out.pixels(), out.channels), dy, grads, &dx, sync_);
      dy = dx;
    }
    const nn::map_shape s0 = stem_.output_shape();
    const auto c0 = stem_out_.view(n * s0.pixels(), s0.channels);
    stem_bn_.backward(values, c0, stem_bn_.relu_gradient(c0, dy), grads, dy, sync_);
    stem_.backward(values, images_, dy, grads, nullptr);
  }

 private:
  template <class Fn>
  void for_each_bn(Fn&& fn) {
    fn(stem_bn_);
    for (auto& b : blocks_) {
      fn(b.bn1());
      fn(b.bn2());
    }
  }
  void init_batch_norm() {
    stem_bn_.init(params_.values());
    for (auto& b : blocks_)
      b.init(params_.values());
  }

  config config_;
  nn::parameter_set params_;
  nn::conv2d stem_;
  nn::batch_norm stem_bn_;
  std::vector<nn::basic_block> blocks_;
  nn::global_avg_pool pool_;
  nn::linear fc_;
  nn::mode mode_ = nn::mode::train;
  nn::stat_reducer sync_;
  // Activations of the last forward: stem conv output, stem output and each block's output.
  nn::scratch stem_out_;
  std::vector<nn::scratch> acts_;
  nn::scratch pooled_, dpooled_, ping_, pong_;
  matrix_view<const float> images_{};
  std::size_t batch_ = 0;
  bool backward_ready_ = false;
};

}  // namespace strata::models

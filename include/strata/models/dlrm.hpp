/// @file dlrm.hpp
/// DLRM (Naumov et al., 2019): bottom MLP on dense features, pairwise dot interaction with the
/// embedding rows, top MLP to a click logit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/embedding/concepts.hpp"
#include "strata/models/concepts.hpp"
#include "strata/models/dlrm_config.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/interaction.hpp"
#include "strata/nn/mlp.hpp"
#include "strata/nn/parameters.hpp"

namespace strata::models {

/// DLRM's dense part:
/// ```
/// z      = relu(bottom_mlp(dense))                 // batch × d, ReLU after every layer
/// x      = interaction(z, e_0 … e_{F−1})           // batch × (d + (F+1)F/2)
/// logit  = top_mlp(x)                              // ReLU between layers, none at the end
/// ```
/// As DLRM's reference (`sigmoid_bot = −1`), the bottom MLP has a ReLU after its last layer
/// too; the top MLP's output is a logit (apply nn::bce_with_logits). Parameters: bottom
/// layers then top layers, each weight (xavier_uniform) then bias (fan_in_uniform), in one
/// nn::parameter_set seeded by `config::seed`.
///
/// Cost per sample: 2·Σ in·out flops forward (≈ 0.95 Mflop for the Kaggle config) and about
/// twice that backward, plus (F+1)²·d per interaction. Models `ctr_model`. Not thread-safe;
/// uses oneTBB inside (deterministic, see nn::linear).
class dlrm {
 public:
  /// Sizes (models::dlrm_config); the defaults are DLRM's Criteo Kaggle configuration.
  using config = dlrm_config;

  dlrm() : dlrm(config{}) {}
  explicit dlrm(const config& c) : config_(c), interaction_(c.sparse_features, c.embedding_dim) {
    detail::check_dlrm_config("dlrm::config", c);
    const auto rows = detail::table_rows("dlrm", c.table_rows, c.sparse_features);
    for (std::size_t f = 0; f < c.sparse_features; ++f)
      tables_.push_back({cat("C", f + 1), rows[f], c.embedding_dim});
    const dlrm_layers layers(c);  // the layout cuda::dlrm shares
    bottom_ = nn::mlp(params_, layers.bottom, true, "bottom");
    top_ = nn::mlp(params_, layers.top, false, "top");
    bottom_.set_gemm_engine(c.gemm);
    top_.set_gemm_engine(c.gemm);
    params_.allocate(c.seed);
  }

  [[nodiscard]] const config& get_config() const noexcept { return config_; }
  /// Tables "C1" … "C<F>", each of dim embedding_dim.
  [[nodiscard]] std::vector<embedding::table_spec> tables() const { return tables_; }
  [[nodiscard]] std::size_t dense_features() const noexcept { return config_.dense_features; }
  [[nodiscard]] std::size_t sparse_features() const noexcept { return config_.sparse_features; }
  /// Table t ("C<t+1>") reads sparse column t.
  [[nodiscard]] std::size_t input_column(std::size_t t) const noexcept { return t; }
  [[nodiscard]] std::span<float> parameters() noexcept { return params_.values(); }
  [[nodiscard]] std::span<const float> parameters() const noexcept { return params_.values(); }
  [[nodiscard]] std::span<float> gradients() noexcept { return params_.grads(); }
  [[nodiscard]] std::span<const float> gradients() const noexcept { return params_.grads(); }
  /// The named blocks of the flat buffers.
  [[nodiscard]] const nn::parameter_set& parameter_blocks() const noexcept { return params_; }

  void forward(const ctr_inputs& in, std::span<float> logits) {
    detail::check_inputs("dlrm", tables_, config_.dense_features, in);
    const std::size_t batch = in.dense.rows();
    nn::detail::expect_size("dlrm::forward", "logits size", logits.size(), batch);
    batch_ = batch;
    embedded_.assign(in.embedded.begin(), in.embedded.end());
    const auto z = bottom_.forward(params_.values(), in.dense);
    const auto x = x_.view(batch, interaction_.output_cols());
    interaction_.forward(z, embedded_, x);
    const auto out = top_.forward(params_.values(), x);
    for (std::size_t i = 0; i < batch; ++i)
      logits[i] = out(i, 0);
    forwarded_ = true;
  }

  void backward(std::span<const float> dlogits,
                std::span<const matrix_view<float>> embedded_grads) {
    if (!forwarded_)
      fail(errc::invalid_argument, "dlrm::backward called before forward; run forward first");
    nn::detail::expect_size("dlrm::backward", "dlogits size", dlogits.size(), batch_);
    detail::check_embedding_grads("dlrm", tables_, batch_, embedded_grads);
    const matrix_view<const float> dy(dlogits.data(), batch_, 1);
    const auto dx = dx_.view(batch_, interaction_.output_cols());
    top_.backward(params_.values(), dy, params_.grads(), dx);
    const auto dz = dz_.view(batch_, config_.embedding_dim);
    interaction_.backward(bottom_.output(), embedded_, dx, dz, embedded_grads);
    bottom_.backward(params_.values(), dz, params_.grads());
  }

 private:
  config config_;
  std::vector<embedding::table_spec> tables_;
  nn::parameter_set params_;
  nn::mlp bottom_;
  nn::interaction interaction_;
  nn::mlp top_;
  std::vector<matrix_view<const float>> embedded_;
  nn::scratch x_, dx_, dz_;
  std::size_t batch_ = 0;
  bool forwarded_ = false;
};

static_assert(ctr_model<dlrm>);

/// A DLRM whose sizes are the type `Shape` (a `dlrm_shape`, e.g. criteo_kaggle_dlrm): the
/// same model as `dlrm`, with `embedding_bytes` and `dense_bytes` as compile-time constants
/// (train::auto_trainer picks the strategy from them). Its config is a `dlrm_config` with the
/// shape's sizes (`shape_config()`; the seed and GEMM engine may be changed); a config of
/// other sizes is refused.
template <dlrm_shape Shape>
class static_dlrm : public dlrm {
 public:
  using shape = Shape;
  using config = dlrm_config;
  static constexpr std::uint64_t embedding_bytes = dlrm_sizes<Shape>::embedding_bytes;
  static constexpr std::uint64_t dense_bytes = dlrm_sizes<Shape>::dense_bytes;

  /// The shape's sizes as a configuration (seed 0, the default GEMM engine).
  [[nodiscard]] static config shape_config() { return dlrm_sizes<Shape>::config(); }

  static_dlrm() : static_dlrm(shape_config()) {}
  explicit static_dlrm(const config& c) : dlrm(checked(c)) {}

 private:
  static const config& checked(const config& c) {
    STRATA_EXPECTS(dlrm_sizes<Shape>::matches(c),
                   "static_dlrm: the configuration's sizes differ from the shape type's (its "
                   "strategy was chosen at compile time for those): start from "
                   "static_dlrm<Shape>::shape_config() and change only seed or gemm");
    return c;
  }
};

}  // namespace strata::models

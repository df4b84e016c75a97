/// @file wide_deep.hpp
/// Wide & Deep (Cheng et al., 2016): a linear model over one-hot sparse features plus an MLP
/// over dense features and embeddings, summed into one click logit.
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
#include "strata/nn/common.hpp"
#include "strata/nn/concat.hpp"
#include "strata/nn/mlp.hpp"
#include "strata/nn/parameters.hpp"

namespace strata::models {

/// Wide & Deep's dense part, for F sparse and D dense features:
/// ```
/// logit = Σ_f w_f + b_wide + deep_mlp([dense | v_0 | … | v_{F−1}])
/// ```
/// where w_f (batch × 1) is the row of wide table f ("wide_<f>", dim 1: the weight of the
/// sample's category in a linear model) and v_f (batch × d) the row of deep table f
/// ("deep_<f>"). tables() lists the F wide tables first, then the F deep tables:
/// `is_wide(t)` ⇔ t < wide_table_count() (`wide_tables_first` = 0); give the wide tables an
/// FTRL-style optimizer. The deep MLP has ReLU between layers and none at the end.
/// Flat parameters: b_wide (zeros), then the deep layers (weight, bias per layer).
///
/// Cost per sample: 2·Σ in·out flops forward for the deep MLP, F adds for the wide part.
/// Models `ctr_model`. Not thread-safe; uses oneTBB inside (deterministic).
class wide_deep {
 public:
  /// Index of the first wide table in tables() (the wide tables are [0, F)).
  static constexpr std::size_t wide_tables_first = 0;

  /// Sizes of the model.
  struct config {
    std::size_t sparse_features = 26;
    std::size_t dense_features = 13;
    std::size_t deep_dim = 16;  ///< dim of the deep embedding tables
    /// Rows per sparse feature (shared by its wide and deep table): one per feature or one
    /// for all (0 = no fixed vocabulary).
    std::vector<std::uint64_t> table_rows = {1 << 20};
    /// Output sizes of the deep MLP's layers (its input is D + F·d); the last must be 1.
    std::vector<std::size_t> deep_mlp = {256, 128, 1};
    std::uint64_t seed = 0;  ///< initialisation seed of the dense parameters
    /// The library multiplying the deep MLP's matrices (nn/gemm.hpp).
    nn::gemm_engine gemm = nn::default_gemm_engine();
  };

  wide_deep() : wide_deep(config{}) {}
  explicit wide_deep(const config& c) : config_(c) {
    STRATA_EXPECTS(c.sparse_features > 0, "wide_deep::config: sparse_features must be positive");
    STRATA_EXPECTS(c.deep_dim > 0, "wide_deep::config: deep_dim must be positive");
    STRATA_EXPECTS(!c.deep_mlp.empty() && c.deep_mlp.back() == 1,
                   "wide_deep::config: the deep MLP must end in 1 output (the logit)");
    const auto rows = detail::table_rows("wide_deep", c.table_rows, c.sparse_features);
    for (std::size_t f = 0; f < c.sparse_features; ++f)
      tables_.push_back({cat("wide_", f), rows[f], 1});
    for (std::size_t f = 0; f < c.sparse_features; ++f)
      tables_.push_back({cat("deep_", f), rows[f], c.deep_dim});
    bias_offset_ = params_.add("wide.bias", 1, nn::init_scheme::zeros);
    std::vector<std::size_t> sizes = {deep_input_cols()};
    sizes.insert(sizes.end(), c.deep_mlp.begin(), c.deep_mlp.end());
    deep_ = nn::mlp(params_, sizes, false, "deep");
    deep_.set_gemm_engine(c.gemm);
    params_.allocate(c.seed);
  }

  [[nodiscard]] const config& get_config() const noexcept { return config_; }
  [[nodiscard]] std::vector<embedding::table_spec> tables() const { return tables_; }
  [[nodiscard]] std::size_t dense_features() const noexcept { return config_.dense_features; }
  [[nodiscard]] std::size_t sparse_features() const noexcept { return config_.sparse_features; }
  /// The wide tables start at zero (a linear model's weights); the deep ones at random.
  [[nodiscard]] bool zero_initialised(std::size_t t) const noexcept { return is_wide(t); }
  /// Wide table f and deep table F + f both read sparse column f.
  [[nodiscard]] std::size_t input_column(std::size_t t) const noexcept {
    return t % config_.sparse_features;
  }
  /// Number of wide tables (F); they are tables [wide_tables_first, wide_tables_first + F).
  [[nodiscard]] std::size_t wide_table_count() const noexcept { return config_.sparse_features; }
  /// Whether table t is a wide (dim 1, linear) table.
  [[nodiscard]] bool is_wide(std::size_t t) const noexcept {
    return t >= wide_tables_first && t < wide_tables_first + config_.sparse_features;
  }
  [[nodiscard]] std::span<float> parameters() noexcept { return params_.values(); }
  [[nodiscard]] std::span<const float> parameters() const noexcept { return params_.values(); }
  [[nodiscard]] std::span<float> gradients() noexcept { return params_.grads(); }
  [[nodiscard]] std::span<const float> gradients() const noexcept { return params_.grads(); }
  [[nodiscard]] const nn::parameter_set& parameter_blocks() const noexcept { return params_; }

  void forward(const ctr_inputs& in, std::span<float> logits) {
    detail::check_inputs("wide_deep", tables_, config_.dense_features, in);
    const std::size_t batch = in.dense.rows();
    nn::detail::expect_size("wide_deep::forward", "logits size", logits.size(), batch);
    const std::size_t f_count = config_.sparse_features;
    parts_.assign({in.dense});
    parts_.insert(parts_.end(), in.embedded.begin() + static_cast<std::ptrdiff_t>(f_count),
                  in.embedded.end());
    const auto x = x_.view(batch, deep_input_cols());
    nn::concat::forward(parts_, x);
    const auto deep = deep_.forward(params_.values(), x);
    const float bias = params_.values()[bias_offset_];
    for (std::size_t i = 0; i < batch; ++i) {
      float wide = bias;
      for (std::size_t f = 0; f < f_count; ++f)
        wide += in.embedded[wide_tables_first + f](i, 0);
      logits[i] = wide + deep(i, 0);
    }
    batch_ = batch;
    forwarded_ = true;
  }

  void backward(std::span<const float> dlogits,
                std::span<const matrix_view<float>> embedded_grads) {
    if (!forwarded_)
      fail(errc::invalid_argument, "wide_deep::backward called before forward; run forward first");
    nn::detail::expect_size("wide_deep::backward", "dlogits size", dlogits.size(), batch_);
    detail::check_embedding_grads("wide_deep", tables_, batch_, embedded_grads);
    const std::size_t f_count = config_.sparse_features;
    double bias_grad = 0.0;
    for (std::size_t i = 0; i < batch_; ++i) {
      bias_grad += dlogits[i];
      for (std::size_t f = 0; f < f_count; ++f)
        embedded_grads[wide_tables_first + f](i, 0) = dlogits[i];
    }
    params_.grads()[bias_offset_] = static_cast<float>(bias_grad);
    const matrix_view<const float> dy(dlogits.data(), batch_, 1);
    const auto dx = dx_.view(batch_, deep_input_cols());
    deep_.backward(params_.values(), dy, params_.grads(), dx);
    dparts_.assign({matrix_view<float>(nullptr, 0, config_.dense_features)});
    dparts_.insert(dparts_.end(), embedded_grads.begin() + static_cast<std::ptrdiff_t>(f_count),
                   embedded_grads.end());
    nn::concat::backward(dx, dparts_);
  }

 private:
  [[nodiscard]] std::size_t deep_input_cols() const noexcept {
    return config_.dense_features + config_.sparse_features * config_.deep_dim;
  }

  config config_;
  std::vector<embedding::table_spec> tables_;
  nn::parameter_set params_;
  std::size_t bias_offset_ = 0;
  nn::mlp deep_;
  std::vector<matrix_view<const float>> parts_;
  std::vector<matrix_view<float>> dparts_;
  nn::scratch x_, dx_;
  std::size_t batch_ = 0;
  bool forwarded_ = false;
};

static_assert(ctr_model<wide_deep>);

}  // namespace strata::models

/// @file dlrm_config.hpp
/// DLRM's sizes, shared by the CPU model (models::dlrm) and the GPU one (cuda::dlrm, whose
/// header must stay free of Eigen / oneTBB, so the configuration lives apart from the model).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/models/criteo_kaggle.hpp"
#include "strata/nn/gemm_engine.hpp"

namespace strata::models {

/// Sizes of a DLRM; the defaults are DLRM's Criteo Kaggle configuration (bottom
/// 13-512-256-64-16, top 367-512-256-1 with 367 = 16 + 27·26/2).
struct dlrm_config {
  std::size_t dense_features = 13;
  std::size_t sparse_features = 26;
  std::size_t embedding_dim = 16;
  /// Rows per table: one per sparse feature, or one value for all (0 = no fixed vocabulary).
  std::vector<std::uint64_t> table_rows = criteo_kaggle_table_rows();
  /// Output sizes of the bottom MLP's layers (its input is dense_features); the last must
  /// equal embedding_dim.
  std::vector<std::size_t> bottom_mlp = {512, 256, 64, 16};
  /// Output sizes of the top MLP's layers (its input is d + (F+1)F/2); the last must be 1.
  std::vector<std::size_t> top_mlp = {512, 256, 1};
  std::uint64_t seed = 0;  ///< initialisation seed of the dense parameters
  /// The library multiplying the MLPs' matrices on the CPU (nn/gemm.hpp; cuda::dlrm uses
  /// cuBLAS whatever this says). Engines agree up to float rounding, not bitwise: runs that
  /// must reproduce each other bitwise use the same one.
  nn::gemm_engine gemm = nn::default_gemm_engine();
};

/// Columns of DLRM's dot interaction output (the top MLP's input): the bottom MLP's d outputs
/// and the (F+1)F/2 pairwise dots of them and the F embeddings.
constexpr std::size_t dlrm_interaction_cols(std::size_t sparse_features, std::size_t dim) {
  return dim + (sparse_features + 1) * sparse_features / 2;
}

/// DLRM's parameter layout: the widths (input first) of its bottom MLP then its top MLP, whose
/// layers are registered in this order as "bottom.<l>" and "top.<l>" (nn::add_mlp: each
/// weight, then bias). models::dlrm and cuda::dlrm both build their flat buffers from it.
struct dlrm_layers {
  std::vector<std::size_t> bottom, top;

  explicit dlrm_layers(const dlrm_config& c) {
    bottom.push_back(c.dense_features);
    bottom.insert(bottom.end(), c.bottom_mlp.begin(), c.bottom_mlp.end());
    top.push_back(dlrm_interaction_cols(c.sparse_features, c.embedding_dim));
    top.insert(top.end(), c.top_mlp.begin(), c.top_mlp.end());
  }
};

namespace detail {
/// The checks every DLRM makes of its sizes; `who` starts the messages ("dlrm::config").
inline void check_dlrm_config(const char* who, const dlrm_config& c) {
  STRATA_EXPECTS(c.dense_features > 0, who, ": dense_features must be positive");
  STRATA_EXPECTS(c.sparse_features > 0, who, ": sparse_features must be positive");
  STRATA_EXPECTS(!c.bottom_mlp.empty() && c.bottom_mlp.back() == c.embedding_dim, who,
                 ": the bottom MLP must end in embedding_dim = ", c.embedding_dim,
                 " (its output meets the embeddings in the dot interaction)");
  STRATA_EXPECTS(!c.top_mlp.empty() && c.top_mlp.back() == 1, who,
                 ": the top MLP must end in 1 output (the logit)");
  nn::expect_gemm_available(c.gemm, who);
}
/// Parameters of an MLP from `in` inputs through `layers` (a weight matrix and a bias each).
constexpr std::uint64_t mlp_parameters(std::size_t in, std::span<const std::size_t> layers) {
  std::uint64_t count = 0;
  for (const std::size_t out : layers) {
    count += std::uint64_t{in} * out + out;
    in = out;
  }
  return count;
}
}  // namespace detail

/// A DLRM whose sizes are a type: every member a compile-time constant, so its embedding and
/// dense bytes — and the strategy that suits them (train::auto_trainer) — are known when the
/// program compiles. `models::criteo_kaggle_dlrm` is DLRM's Kaggle configuration:
/// ```cpp
/// struct my_shape {
///   static constexpr std::size_t dense_features = 13, embedding_dim = 16;
///   static constexpr std::array<std::uint64_t, 26> table_rows = {…};  // one per sparse feature
///   static constexpr std::array<std::size_t, 4> bottom_mlp = {512, 256, 64, 16};
///   static constexpr std::array<std::size_t, 3> top_mlp = {512, 256, 1};
/// };
/// ```
template <class S>
concept dlrm_shape = requires {
  { S::dense_features } -> std::convertible_to<std::size_t>;
  { S::embedding_dim } -> std::convertible_to<std::size_t>;
  { S::table_rows.size() } -> std::convertible_to<std::size_t>;
  { S::table_rows[0] } -> std::convertible_to<std::uint64_t>;
  { S::bottom_mlp.size() } -> std::convertible_to<std::size_t>;
  { S::top_mlp.size() } -> std::convertible_to<std::size_t>;
};

/// The sizes of a `dlrm_shape` at compile time, and its runtime configuration.
template <dlrm_shape S>
struct dlrm_sizes {
  static constexpr std::size_t sparse_features = S::table_rows.size();
  /// Bytes of every embedding table (rows × dim float32 weights; optimizer state not counted).
  static constexpr std::uint64_t embedding_bytes = [] {
    std::uint64_t rows = 0;
    for (const auto r : S::table_rows)
      rows += r;
    return rows * S::embedding_dim * sizeof(float);
  }();
  /// Dense parameters: the bottom MLP from the dense features, the top MLP from the dot
  /// interaction's d + (F+1)F/2 outputs (models::dlrm's layout).
  static constexpr std::uint64_t dense_parameters =
      detail::mlp_parameters(S::dense_features, S::bottom_mlp) +
      detail::mlp_parameters(dlrm_interaction_cols(sparse_features, S::embedding_dim), S::top_mlp);
  static constexpr std::uint64_t dense_bytes = dense_parameters * sizeof(float);
  static_assert(S::bottom_mlp.size() > 0 && S::bottom_mlp.back() == S::embedding_dim,
                "dlrm_shape: the bottom MLP must end in embedding_dim (its output meets the "
                "embeddings in the dot interaction)");
  static_assert(S::top_mlp.size() > 0 && S::top_mlp.back() == 1,
                "dlrm_shape: the top MLP must end in 1 output (the logit)");

  /// The shape as a runtime configuration (seed 0, the default GEMM engine).
  static dlrm_config config() {
    dlrm_config c;
    c.dense_features = S::dense_features;
    c.sparse_features = sparse_features;
    c.embedding_dim = S::embedding_dim;
    c.table_rows.assign(S::table_rows.begin(), S::table_rows.end());
    c.bottom_mlp.assign(S::bottom_mlp.begin(), S::bottom_mlp.end());
    c.top_mlp.assign(S::top_mlp.begin(), S::top_mlp.end());
    return c;
  }
  /// True when `c` has exactly this shape's sizes (its seed and GEMM engine are free).
  static bool matches(const dlrm_config& c) {
    const dlrm_config s = config();
    std::vector<std::uint64_t> rows = c.table_rows;
    if (rows.size() == 1) rows.assign(sparse_features, rows[0]);  // one value for every table
    return c.dense_features == s.dense_features && c.sparse_features == s.sparse_features &&
           c.embedding_dim == s.embedding_dim && rows == s.table_rows &&
           c.bottom_mlp == s.bottom_mlp && c.top_mlp == s.top_mlp;
  }
};

/// DLRM's Criteo Kaggle configuration as a shape (bottom 13-512-256-64-16, top 367-512-256-1,
/// the 26 tables of criteo_kaggle_rows at dim 16): 2.16 GB of tables, 1.9 MB of MLPs.
struct criteo_kaggle_dlrm {
  static constexpr std::size_t dense_features = 13;
  static constexpr std::size_t embedding_dim = 16;
  static constexpr std::array<std::uint64_t, 26> table_rows = criteo_kaggle_rows;
  static constexpr std::array<std::size_t, 4> bottom_mlp = {512, 256, 64, 16};
  static constexpr std::array<std::size_t, 3> top_mlp = {512, 256, 1};
};
static_assert(dlrm_shape<criteo_kaggle_dlrm>);

}  // namespace strata::models

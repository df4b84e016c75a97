/// @file dlrm_config.hpp
/// DLRM's sizes, shared by the CPU model (models::dlrm) and the GPU one (cuda::dlrm, whose
/// header must stay free of Eigen / oneTBB, so the configuration lives apart from the model).
#pragma once

#include <cstddef>
#include <cstdint>
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
  nn::gemm_engine gemm = nn::default_gemm_engine;
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
}  // namespace detail

}  // namespace strata::models

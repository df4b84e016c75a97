/// @file interaction.hpp
/// DLRM's pairwise dot-product feature interaction (Naumov et al., 2019).
#pragma once

#include <algorithm>
#include <cstddef>
#include <span>
#include <string_view>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/common.hpp"

namespace strata::nn {

/// Dot interaction of the bottom-MLP output z (batch × d) with F embedding batches
/// e_0 … e_{F−1} (each batch × d). Per sample, with T = [z; e_0; …; e_{F−1}] ((F+1) × d):
/// ```
/// out = [ z | (T·Tᵀ)[i][j] for i in 1..F, j in 0..i−1 ]      // batch × (d + (F+1)F/2)
/// ```
/// (strictly lower triangle in row-major order, as DLRM's reference `interact_features`).
/// backward: with S symmetric, S[i][j] = S[j][i] = dout[d + idx(i, j)], zero diagonal,
/// dT = S·T, so dz = dout[:, :d] + dT[0] and de_f = dT[f + 1].
///
/// Cost per sample: one (F+1)×d × d×(F+1) Eigen product forward, one (F+1)² × (F+1)×d
/// backward. Parallel over fixed 128-row blocks for batch ≥ 256; every row is independent,
/// so results never depend on the thread count. Stateless apart from its sizes; const calls
/// are thread-safe.
class interaction {
 public:
  interaction() = default;
  interaction(std::size_t features, std::size_t dim) : features_(features), dim_(dim) {
    STRATA_EXPECTS(dim > 0, "interaction: embedding dim must be positive");
  }

  [[nodiscard]] std::size_t features() const noexcept { return features_; }
  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  /// Number of pairwise dots, (F+1)F/2.
  [[nodiscard]] std::size_t pairs() const noexcept { return (features_ + 1) * features_ / 2; }
  /// Output columns, d + (F+1)F/2.
  [[nodiscard]] std::size_t output_cols() const noexcept { return dim_ + pairs(); }

  void forward(matrix_view<const float> z, std::span<const matrix_view<const float>> emb,
               matrix_view<float> out) const {
    check_inputs("interaction::forward", z, emb);
    detail::expect_shape("interaction::forward", "output", out, z.rows(), output_cols());
    const auto n = static_cast<Eigen::Index>(features_ + 1);
    const auto d = static_cast<Eigen::Index>(dim_);
    detail::for_row_blocks(z.rows(), [&](std::size_t first, std::size_t count) {
      detail::row_major_matrix<float> t(n, d);
      detail::row_major_matrix<float> dots(n, n);
      for (std::size_t r = first; r < first + count; ++r) {
        gather(z, emb, r, t);
        dots.noalias() = t * t.transpose();
        const auto o = out.row(r);
        const auto zr = z.row(r);
        std::copy(zr.begin(), zr.end(), o.begin());
        std::size_t k = dim_;
        for (Eigen::Index i = 1; i < n; ++i)
          for (Eigen::Index j = 0; j < i; ++j)
            o[k++] = dots(i, j);
      }
    });
  }

  /// Writes dz and every de_f (overwriting them) from dout.
  void backward(matrix_view<const float> z, std::span<const matrix_view<const float>> emb,
                matrix_view<const float> dout, matrix_view<float> dz,
                std::span<const matrix_view<float>> demb) const {
    check_inputs("interaction::backward", z, emb);
    detail::expect_shape("interaction::backward", "dout", dout, z.rows(), output_cols());
    detail::expect_shape("interaction::backward", "dz", dz, z.rows(), dim_);
    detail::expect_size("interaction::backward", "number of embedding gradients", demb.size(),
                        features_);
    for (std::size_t f = 0; f < features_; ++f)  // the name is built only for the message
      if (demb[f].rows() != z.rows() || demb[f].cols() != dim_)
        detail::expect_shape("interaction::backward", cat("gradient of embedding ", f), demb[f],
                             z.rows(), dim_);
    const auto n = static_cast<Eigen::Index>(features_ + 1);
    const auto d = static_cast<Eigen::Index>(dim_);
    detail::for_row_blocks(z.rows(), [&](std::size_t first, std::size_t count) {
      detail::row_major_matrix<float> t(n, d);
      detail::row_major_matrix<float> dt(n, d);
      detail::row_major_matrix<float> s = detail::row_major_matrix<float>::Zero(n, n);
      for (std::size_t r = first; r < first + count; ++r) {
        gather(z, emb, r, t);
        const auto g = dout.row(r);
        std::size_t k = dim_;
        for (Eigen::Index i = 1; i < n; ++i)
          for (Eigen::Index j = 0; j < i; ++j) {
            s(i, j) = g[k];
            s(j, i) = g[k];
            ++k;
          }
        dt.noalias() = s * t;
        const auto dzr = dz.row(r);
        for (std::size_t c = 0; c < dim_; ++c)
          dzr[c] = g[c] + dt(0, static_cast<Eigen::Index>(c));
        for (std::size_t f = 0; f < features_; ++f) {
          const auto de = demb[f].row(r);
          for (std::size_t c = 0; c < dim_; ++c)
            de[c] = dt(static_cast<Eigen::Index>(f + 1), static_cast<Eigen::Index>(c));
        }
      }
    });
  }

 private:
  void check_inputs(std::string_view where, matrix_view<const float> z,
                    std::span<const matrix_view<const float>> emb) const {
    detail::expect_shape(where, "z (bottom MLP output)", z, z.rows(), dim_);
    detail::expect_size(where, "number of embedding inputs", emb.size(), features_);
    for (std::size_t f = 0; f < features_; ++f)  // the name is built only for the message
      if (emb[f].rows() != z.rows() || emb[f].cols() != dim_)
        detail::expect_shape(where, cat("embedding input ", f), emb[f], z.rows(), dim_);
  }

  static void gather(matrix_view<const float> z, std::span<const matrix_view<const float>> emb,
                     std::size_t r, detail::row_major_matrix<float>& t) {
    const auto zr = z.row(r);
    std::copy(zr.begin(), zr.end(), t.row(0).data());
    for (std::size_t f = 0; f < emb.size(); ++f) {
      const auto er = emb[f].row(r);
      std::copy(er.begin(), er.end(), t.row(static_cast<Eigen::Index>(f + 1)).data());
    }
  }

  std::size_t features_ = 0;
  std::size_t dim_ = 0;
};

}  // namespace strata::nn

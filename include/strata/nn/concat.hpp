/// @file concat.hpp
/// Column-wise concatenation of batches: out = [a | b | …].
#pragma once

#include <cstddef>
#include <span>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/common.hpp"

namespace strata::nn {

/// Concatenates row-aligned batches along columns. forward: `out.row(r)` = parts[0].row(r),
/// parts[1].row(r), …; backward splits `dout` back into the parts' gradients (a part whose
/// gradient view has 0 rows is skipped — its columns still count — e.g. raw dense inputs).
/// Cost: one copy of the batch; parallel over fixed row blocks for batch ≥ 256. Stateless.
struct concat {
  static void forward(std::span<const matrix_view<const float>> parts, matrix_view<float> out) {
    std::size_t cols = 0;
    for (std::size_t p = 0; p < parts.size(); ++p) {
      if (parts[p].rows() != out.rows())
        fail(errc::size_mismatch,
             cat("concat::forward: part ", p, " has ", parts[p].rows(), " rows but the output has ",
                 out.rows(), "; all parts must hold the same batch"));
      cols += parts[p].cols();
    }
    detail::expect_size("concat::forward", "output columns", out.cols(), cols);
    detail::for_row_blocks(out.rows(), [&](std::size_t first, std::size_t count) {
      auto o = detail::as_eigen(out.rows_slice(first, count));
      Eigen::Index offset = 0;
      for (const auto& part : parts) {
        const auto w = static_cast<Eigen::Index>(part.cols());
        o.middleCols(offset, w) = detail::as_eigen(part.rows_slice(first, count));
        offset += w;
      }
    });
  }

  static void backward(matrix_view<const float> dout, std::span<const matrix_view<float>> dparts) {
    std::size_t cols = 0;
    for (std::size_t p = 0; p < dparts.size(); ++p) {
      if (dparts[p].rows() != dout.rows() && dparts[p].rows() != 0)
        fail(errc::size_mismatch, cat("concat::backward: gradient of part ", p, " has ",
                                      dparts[p].rows(), " rows but dout has ", dout.rows(),
                                      "; pass the batch's rows, or 0 rows to skip the part"));
      cols += dparts[p].cols();
    }
    detail::expect_size("concat::backward", "dout columns", dout.cols(), cols);
    detail::for_row_blocks(dout.rows(), [&](std::size_t first, std::size_t count) {
      const auto d = detail::as_eigen(dout.rows_slice(first, count));
      Eigen::Index offset = 0;
      for (const auto& part : dparts) {
        const auto w = static_cast<Eigen::Index>(part.cols());
        if (part.rows() != 0)
          detail::as_eigen(part.rows_slice(first, count)) = d.middleCols(offset, w);
        offset += w;
      }
    });
  }
};

}  // namespace strata::nn

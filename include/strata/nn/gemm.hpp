/// @file gemm.hpp
/// The dense layers' matrix product on one of three libraries: Eigen (every build), oneDNN's
/// sgemm (`libdnnl-dev`) or the system CBLAS (`libblas-dev`; on Debian the alternatives
/// system points it at OpenBLAS when `libopenblas0-pthread` is installed).
///
/// Every call is single-threaded on the calling thread: the layers split their work into
/// fixed blocks over oneTBB themselves (one pool runs the machine), and a product of a given
/// shape on one thread is the same instruction sequence whatever the thread count, so results
/// stay bitwise independent of it. oneDNN's sgemm runs on its OpenMP runtime: the calling
/// thread's OpenMP thread count is set to 1 first (nn/detail/onednn.hpp). OpenBLAS would start
/// its own threads: its `openblas_set_num_threads(1)` (looked up with dlsym, so any CBLAS
/// links) is called once per process before the first product.
///
/// Measured (bench_dlrm, docs/benchmarks.md): alone, both libraries beat Eigen by 1.2–1.6× per
/// product on DLRM's shapes; on the whole DLRM step CBLAS (OpenBLAS) is the fastest where
/// OpenBLAS knows the CPU, and the default then (`default_gemm_engine()`, which falls back to
/// oneDNN when OpenBLAS runs a kernel older than the CPU). One-row and one-column products
/// (a predictor's batch 1, a layer with one output) go to CBLAS's sgemv instead of its sgemm.
/// The CBLAS engine is only as fast as the library behind libblas.so.3: Debian's reference BLAS
/// (without libopenblas0-pthread) is far slower.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstddef>

#ifdef STRATA_HAS_CBLAS
#include <dlfcn.h>
extern "C" {
#include <cblas.h>
}
#endif

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/detail/onednn.hpp"
#include "strata/nn/gemm_engine.hpp"

namespace strata::nn {

namespace detail {

#ifdef STRATA_HAS_CBLAS
/// Keeps OpenBLAS (when that is the CBLAS) from starting threads of its own; once per process.
inline void cblas_single_threaded() {
  static const bool done = [] {
    using set_threads_fn = void (*)(int);
    if (const auto set_threads =
            reinterpret_cast<set_threads_fn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
      set_threads(1);
    return true;
  }();
  (void)done;
}

/// c ← op(a)·op(b) + beta·c when c is one row or one column, as a matrix-vector product
/// (cblas_sgemv). OpenBLAS's sgemm packs both operands on every call, which a one-row product
/// cannot amortise: at batch 1 that made the DLRM predictor 5× slower than Eigen. Which kernel
/// runs depends only on the product's shape, so results stay independent of the thread count.
inline void cblas_vector_product(matrix_view<const float> a, bool transpose_a,
                                 matrix_view<const float> b, bool transpose_b, float beta,
                                 matrix_view<float> c) {
  const auto leading = [](const auto& view) {
    return static_cast<int>(std::max({view.stride(), view.cols(), std::size_t{1}}));
  };
  // Distance between consecutive elements of a view that is one row or one column.
  const auto step = [&](const auto& view, bool along_column) {
    return along_column ? leading(view) : 1;
  };
  const int m = static_cast<int>(c.rows());
  const int n = static_cast<int>(c.cols());
  // With beta = 0 BLAS may still scale c's old contents by 0 (NaN · 0 is NaN in some
  // OpenBLAS versions): start from zeros, as the other engines do.
  if (beta == 0.0f) as_eigen(c).setZero();
  if (m == 1) {
    // cᵀ = op(b)ᵀ · op(a)ᵀ: op(a) is a 1 × k row (a k × 1 column of a when transposed).
    const int x_step = step(a, transpose_a);
    if (transpose_b)  // b is n × k
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, static_cast<int>(b.cols()), 1.0f, b.data(),
                  leading(b), a.data(), x_step, beta, c.data(), 1);
    else  // b is k × n
      cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(b.rows()), n, 1.0f, b.data(),
                  leading(b), a.data(), x_step, beta, c.data(), 1);
    return;
  }
  // n == 1: c = op(a) · v, v = op(b) as a k-vector (a 1 × k row of b when transposed).
  const int v_step = step(b, !transpose_b);
  if (transpose_a)  // a is k × m
    cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(a.rows()), m, 1.0f, a.data(),
                leading(a), b.data(), v_step, beta, c.data(), leading(c));
  else  // a is m × k
    cblas_sgemv(CblasRowMajor, CblasNoTrans, m, static_cast<int>(a.cols()), 1.0f, a.data(),
                leading(a), b.data(), v_step, beta, c.data(), leading(c));
}
#endif

/// c ← op(a)·op(b) + beta·c on the calling thread, where op(x) is x or xᵀ; row-major views
/// with any row stride. op(a): m × k, op(b): k × n, c: m × n (shapes checked by the caller).
/// beta is 0 (c is only written) or 1 (the product is added to c).
inline void gemm(gemm_engine engine, matrix_view<const float> a, bool transpose_a,
                 matrix_view<const float> b, bool transpose_b, float beta, matrix_view<float> c) {
  const std::size_t m = c.rows();
  const std::size_t n = c.cols();
  const std::size_t k = transpose_a ? a.rows() : a.cols();
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0.0f) as_eigen(c).setZero();
    return;
  }
  switch (engine) {
#ifdef STRATA_HAS_ONEDNN
    case gemm_engine::onednn: {
      onednn_on_this_thread_only();
      const auto status = dnnl_sgemm(
          transpose_a ? 'T' : 'N', transpose_b ? 'T' : 'N', static_cast<dnnl_dim_t>(m),
          static_cast<dnnl_dim_t>(n), static_cast<dnnl_dim_t>(k), 1.0f, a.data(),
          static_cast<dnnl_dim_t>(a.stride()), b.data(), static_cast<dnnl_dim_t>(b.stride()), beta,
          c.data(), static_cast<dnnl_dim_t>(c.stride()));
      if (status != dnnl_success) [[unlikely]]
        fail(errc::internal, cat("nn::gemm: oneDNN's sgemm failed (status ", int(status), ") on ",
                                 m, " x ", k, " x ", n));
      return;
    }
#endif
#ifdef STRATA_HAS_CBLAS
    case gemm_engine::cblas: {
      cblas_single_threaded();
      constexpr std::size_t int_max = 2147483647;
      if (std::max({m, n, k, a.stride(), b.stride(), c.stride()}) > int_max) [[unlikely]]
        fail(errc::invalid_argument,
             cat("nn::gemm: ", m, " x ", k, " x ", n,
                 " is beyond CBLAS's 32-bit sizes; use the 'onednn' or 'eigen' engine"));
      if (m == 1 || n == 1) {
        cblas_vector_product(a, transpose_a, b, transpose_b, beta, c);
        return;
      }
      cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
                  transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                  static_cast<int>(k), 1.0f, a.data(), static_cast<int>(a.stride()), b.data(),
                  static_cast<int>(b.stride()), beta, c.data(), static_cast<int>(c.stride()));
      return;
    }
#endif
    default:
      break;
  }
  auto ce = as_eigen(c);
  const auto product = [&](const auto& lhs, const auto& rhs) {
    if (beta == 0.0f)
      ce.noalias() = lhs * rhs;
    else
      ce.noalias() += lhs * rhs;
  };
  const auto ae = as_eigen(a);
  const auto be = as_eigen(b);
  if (transpose_a && transpose_b)
    product(ae.transpose(), be.transpose());
  else if (transpose_a)
    product(ae.transpose(), be);
  else if (transpose_b)
    product(ae, be.transpose());
  else
    product(ae, be);
}

}  // namespace detail
}  // namespace strata::nn

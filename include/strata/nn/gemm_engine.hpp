/// @file gemm_engine.hpp
/// The choice of library for the dense layers' matrix products (nn/gemm.hpp), kept apart
/// from the products themselves so that configurations (models::dlrm_config, shared with the
/// CUDA model) can name an engine without including Eigen or oneDNN.
#pragma once

#include <optional>
#include <string_view>

#include "strata/core/error.hpp"

namespace strata::nn {

/// True when this build links oneDNN (CMake found libdnnl-dev: `STRATA_HAS_ONEDNN`).
#ifdef STRATA_HAS_ONEDNN
inline constexpr bool onednn_available = true;
#else
inline constexpr bool onednn_available = false;
#endif

/// True when this build links a CBLAS (CMake found libblas-dev: `STRATA_HAS_CBLAS`).
#ifdef STRATA_HAS_CBLAS
inline constexpr bool cblas_available = true;
#else
inline constexpr bool cblas_available = false;
#endif

/// Which library multiplies the dense layers' matrices.
enum class gemm_engine { eigen, onednn, cblas };

/// The engine a new linear layer uses: CBLAS when available, else Eigen. Measured on the whole
/// DLRM training step (bench_dlrm, 2 threads, docs/benchmarks.md): CBLAS on OpenBLAS 1.24× Eigen
/// at batch 128 and 1.32× at 2048; oneDNN's sgemm 0.96× and 1.18× (its per-call cost shows on
/// the 64-row blocks), so oneDNN is never the default.
inline constexpr gemm_engine default_gemm_engine =
    cblas_available ? gemm_engine::cblas : gemm_engine::eigen;

/// Name of an engine ("eigen", "onednn", "cblas").
constexpr std::string_view to_string(gemm_engine e) noexcept {
  switch (e) {
    case gemm_engine::onednn:
      return "onednn";
    case gemm_engine::cblas:
      return "cblas";
    default:
      return "eigen";
  }
}

/// Whether this build can run `e`.
constexpr bool gemm_available(gemm_engine e) noexcept {
  return e == gemm_engine::eigen || (e == gemm_engine::onednn && onednn_available) ||
         (e == gemm_engine::cblas && cblas_available);
}

/// The engine named `name`, or nullopt.
constexpr std::optional<gemm_engine> parse_gemm_engine(std::string_view name) noexcept {
  for (const auto e : {gemm_engine::eigen, gemm_engine::onednn, gemm_engine::cblas})
    if (name == to_string(e)) return e;
  return std::nullopt;
}

/// Throws errc::unsupported naming the engine and the package to install unless this build
/// can run `e`; `where` names the caller.
inline void expect_gemm_available(gemm_engine e, std::string_view where) {
  if (gemm_available(e)) return;
  fail(errc::unsupported, cat(where, ": GEMM engine '", to_string(e), "' is not in this build (",
                              e == gemm_engine::onednn ? "install libdnnl-dev ocl-icd-opencl-dev"
                                                       : "install libblas-dev libopenblas0-pthread",
                              " and re-run CMake); use '", to_string(default_gemm_engine), "'"));
}

}  // namespace strata::nn

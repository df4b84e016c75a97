/// @file gemm_engine.hpp
/// The choice of library for the dense layers' matrix products (nn/gemm.hpp), kept apart
/// from the products themselves so that configurations (models::dlrm_config, shared with the
/// CUDA model) can name an engine without including Eigen or oneDNN.
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <string_view>

#ifdef STRATA_HAS_CBLAS
#include <dlfcn.h>
#endif

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

/// The engine a default-constructed layer, model config or predictor uses, and why.
struct gemm_engine_choice {
  gemm_engine engine = gemm_engine::eigen;
  std::string reason;  ///< one line, e.g. "OpenBLAS with its Haswell kernel"
};

namespace detail {

/// Whether OpenBLAS's kernel `core` (`openblas_get_corename()`: "Haswell", "SkylakeX",
/// "Prescott", …) uses the vector units of a CPU with AVX2 + FMA (`avx2_fma`). OpenBLAS picks
/// its kernel from the CPU's model number; a release older than the CPU falls back to a
/// pre-AVX kernel (0.3.21 runs "Prescott", SSE3, on Sapphire Rapids: its sgemm reaches 73
/// GFLOP/s there on two cores against 192 with OPENBLAS_CORETYPE=SkylakeX).
constexpr bool openblas_core_suits_cpu(std::string_view core, bool avx2_fma) noexcept {
  if (!avx2_fma) return true;  // an older CPU: whatever kernel OpenBLAS matched to it
  constexpr std::string_view avx2_cores[] = {"haswell",        "zen",      "skylakex", "cooperlake",
                                             "sapphirerapids", "excavator"};
  const auto lower = [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; };
  return std::any_of(std::begin(avx2_cores), std::end(avx2_cores), [&](std::string_view name) {
    return core.size() == name.size() && std::equal(core.begin(), core.end(), name.begin(),
                                                    [&](char a, char b) { return lower(a) == b; });
  });
}

/// The rule behind default_gemm_engine(): CBLAS when this build links one, unless it is an
/// OpenBLAS running a kernel older than the CPU (`openblas_core`: its core name, empty for
/// another CBLAS); then oneDNN when linked, else Eigen. Measured (bench_dlrm, docs/benchmarks.md):
/// OpenBLAS with a matching kernel 1.2–1.3× Eigen on the DLRM step (AMD EPYC); with the
/// Prescott fallback 0.33–0.36× Eigen, where oneDNN is 1.14–1.18× (Xeon Sapphire Rapids).
inline gemm_engine_choice choose_gemm_engine(bool cblas, bool onednn,
                                             std::string_view openblas_core, bool avx2_fma) {
  if (cblas && openblas_core.empty()) return {gemm_engine::cblas, "the system CBLAS"};
  if (cblas && openblas_core_suits_cpu(openblas_core, avx2_fma))
    return {gemm_engine::cblas, cat("OpenBLAS with its ", openblas_core, " kernel")};
  const std::string why =
      cblas ? cat("OpenBLAS runs its ", openblas_core,
                  " kernel, older than this AVX2 CPU (about 3x slower); start the program with "
                  "OPENBLAS_CORETYPE=Haswell (or SkylakeX on AVX-512) to use it")
            : std::string("this build has no CBLAS");
  if (onednn) return {gemm_engine::onednn, cat("oneDNN: ", why)};
  return {gemm_engine::eigen, cat("Eigen: ", why)};
}

}  // namespace detail

/// The engine new linear layers, model configs and predictors use, chosen once per process by
/// detail::choose_gemm_engine (CBLAS unless OpenBLAS fell back to an old kernel for this CPU,
/// then oneDNN, then Eigen) and the reason. The same on every run of one machine and
/// environment, so results stay reproducible; pass an engine explicitly (`--gemm`) to fix it
/// across machines.
inline const gemm_engine_choice& default_gemm_choice() {
  static const gemm_engine_choice chosen = [] {
    std::string core;
#ifdef STRATA_HAS_CBLAS
    using corename_fn = char* (*)();
    if (const auto corename =
            reinterpret_cast<corename_fn>(dlsym(RTLD_DEFAULT, "openblas_get_corename")))
      if (const char* name = corename()) core = name;
#endif
    bool avx2_fma = false;
#if defined(__x86_64__) || defined(__i386__)
    avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#endif
    return detail::choose_gemm_engine(cblas_available, onednn_available, core, avx2_fma);
  }();
  return chosen;
}

/// default_gemm_choice().engine.
inline gemm_engine default_gemm_engine() {
  return default_gemm_choice().engine;
}

/// Throws errc::unsupported naming the engine and the package to install unless this build
/// can run `e`; `where` names the caller.
inline void expect_gemm_available(gemm_engine e, std::string_view where) {
  if (gemm_available(e)) return;
  fail(errc::unsupported, cat(where, ": GEMM engine '", to_string(e), "' is not in this build (",
                              e == gemm_engine::onednn ? "install libdnnl-dev ocl-icd-opencl-dev"
                                                       : "install libblas-dev libopenblas0-pthread",
                              " and re-run CMake); use '", to_string(default_gemm_engine()), "'"));
}

}  // namespace strata::nn

/// @file test_support.cuh
/// Shared helpers of the CUDA tests: GPU detection with a clear SKIP, fresh random inputs,
/// NaN poisoning, and comparisons.
#pragma once

#if !defined(__CUDACC__)
#error "test_support.cuh is CUDA test code: include it only from .cu files."
#endif

#include <catch2/catch.hpp>

#include "support/skip.hpp"

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "strata/cuda/common.cuh"

namespace strata::cuda_test {

/// True (after strata_test::skip) when no CUDA device is visible: the test case returns, and
/// ctest reports the program as skipped.
inline bool skip_without_gpu() {
  if (::strata::cuda::device_count() > 0) return false;
  strata_test::skip(
      "no CUDA device found (cudaGetDeviceCount reports none); this CUDA test was compiled but "
      "not run. Run scripts/gpu-check.sh on a GPU machine.");
  return true;
}

/// A fresh seed per run (printed on failure through CAPTURE in the tests).
inline std::uint64_t fresh_seed() {
  return (std::uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
}

inline std::vector<float> random_floats(std::mt19937_64& gen, std::size_t n, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v)
    x = dist(gen);
  return v;
}

/// Device buffer of n floats poisoned with NaN bytes (0xff…), so unwritten elements show.
inline ::strata::cuda::device_buffer<float> poisoned(std::size_t n, cudaStream_t s) {
  ::strata::cuda::device_buffer<float> b(n, s);
  b.fill_bytes(0xff);
  return b;
}

/// |a − b| ≤ 1e-5 · max(|a|, |b|) + tiny, element-wise, reporting the first mismatch.
inline void require_close(const std::vector<float>& got, const std::vector<float>& want,
                          double rel = 1e-5, double abs = 1e-7) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i];
    const bool ok = (std::isnan(a) && std::isnan(b)) ||
                    std::fabs(a - b) <= rel * std::max(std::fabs(a), std::fabs(b)) + abs;
    if (!ok) {
      CAPTURE(i, a, b);
      REQUIRE(ok);
    }
  }
}

/// Bitwise equality of two float vectors.
inline void require_bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) {
      CAPTURE(i, a[i], b[i]);
      REQUIRE(std::bit_cast<std::uint32_t>(a[i]) == std::bit_cast<std::uint32_t>(b[i]));
    }
}

}  // namespace strata::cuda_test

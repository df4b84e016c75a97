/// @file finite.hpp
/// Fast finiteness checks of float buffers (the trainer's divergence guard, checkpoints).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>

namespace strata::detail {

/// Index of the first non-finite value (NaN, ±inf) of `values`, or `values.size()` when all
/// are finite. Scans blocks with Eigen's vectorised sum of (x − x) — 0 for a finite x, NaN
/// otherwise — and looks value by value only inside a block that fails. (Under
/// -ffinite-math-only / -ffast-math the compiler may assume the answer: do not build with it.)
inline std::size_t first_non_finite(std::span<const float> values) {
  constexpr std::size_t block = 4096;
  for (std::size_t first = 0; first < values.size(); first += block) {
    const std::size_t n = std::min(block, values.size() - first);
    const Eigen::Map<const Eigen::ArrayXf> a(values.data() + first, static_cast<Eigen::Index>(n));
    if (!std::isnan((a - a).sum())) continue;
    for (std::size_t i = first; i < first + n; ++i)
      if (!std::isfinite(values[i])) return i;
  }
  return values.size();
}

/// True when every value is finite.
inline bool all_finite(std::span<const float> values) {
  return first_non_finite(values) == values.size();
}

}  // namespace strata::detail

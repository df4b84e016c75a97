/// @file init.hpp
/// Initial values of embedding rows as a pure function of (seed, table index, key), so every
/// storage (local, hash_table, parameter-server shards) and every placement of a row produces
/// the same table.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>

#include "strata/core/rng.hpp"

namespace strata::embedding {

/// Row initialiser: `row[c]` is uniform on [-a, a) with `a = scale` when `scale > 0` and
/// `a = 1/sqrt(dim)` otherwise (so a row's expected squared norm is 1/3 whatever the
/// dimension; DLRM instead uses a = sqrt(1/rows), pass `scale` for that). Exactly:
/// ```
/// u = (counter_rng{seed, mix_ids(table, key)}.block(c / 4)[c % 4] >> 8) · 2^-24   // [0, 1)
/// row[c] = -a + 2a · u
/// ```
/// Pure function of (seed, table, key, column, scale, dim); never of placement or call order,
/// so local tables, hash tables and parameter-server shards hold identical rows.
/// Cost: one Philox4x32-10 block per 4 values. Value type; thread-safe.
struct uniform_init {
  std::uint64_t seed = 0;  ///< model seed
  float scale = 0.0f;      ///< half-width `a` of the interval; 0 means 1/sqrt(dim)

  /// Half-width of the interval used for rows of `dim` values.
  [[nodiscard]] float bound(std::size_t dim) const noexcept {
    if (scale > 0.0f) return scale;
    return dim == 0 ? 0.0f : 1.0f / std::sqrt(static_cast<float>(dim));
  }

  /// Writes the initial values of row `key` of table `table` into `row` (its size is the dim).
  void fill(std::size_t table, std::uint64_t key, std::span<float> row) const noexcept {
    const float a = bound(row.size());
    const counter_rng rng{seed, mix_ids(static_cast<std::uint64_t>(table), key)};
    for (std::size_t c0 = 0; c0 < row.size(); c0 += 4) {
      const auto bits = rng.block(c0 / 4);
      for (std::size_t j = 0; j < 4 && c0 + j < row.size(); ++j)
        row[c0 + j] = to_interval(bits[j], a);
    }
  }

  /// Convenience: the initial value of column `col` of that row, for rows of `dim` values.
  [[nodiscard]] float value(std::size_t table, std::uint64_t key, std::size_t col,
                            std::size_t dim) const noexcept {
    const counter_rng rng{seed, mix_ids(static_cast<std::uint64_t>(table), key)};
    return to_interval(rng.block(col / 4)[col % 4], bound(dim));
  }

 private:
  static float to_interval(std::uint32_t bits, float a) noexcept {
    const float u = static_cast<float>(bits >> 8) * 0x1.0p-24f;
    return -a + 2.0f * a * u;
  }
};

}  // namespace strata::embedding

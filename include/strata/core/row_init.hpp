/// @file row_init.hpp
/// Initial values of embedding rows as a pure function of (seed, table index, key), so every
/// storage (local, hash_table, parameter-server shards) and every placement of a row produces
/// the same table. Below both `embedding/` and `ps/` (each uses it; neither includes the
/// other for it); `embedding::uniform_init` names the same type.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "strata/core/rng.hpp"

namespace strata {

/// Row initialiser: `row[c]` of table t is uniform on [-a, a) with `a = table_scales[t]` when
/// that entry exists and is > 0 (0 when it is `zeros`: the table starts at zero, as a linear
/// model's weights do), else `a = scale` when `scale > 0`, else `a = 1/sqrt(dim)` (a row's
/// expected squared norm is then 1/3 whatever the dimension). DLRM's reference uses
/// a = sqrt(1/rows) per table: `for_rows` builds that (the trainer's default). Exactly:
/// ```
/// u = (counter_rng{seed, mix_ids(table, key)}.block(c / 4)[c % 4] >> 8) · 2^-24   // [0, 1)
/// row[c] = -a + 2a · u
/// ```
/// Pure function of (seed, table, key, column, scale, dim); never of placement or call order,
/// so local tables, hash tables and parameter-server shards hold identical rows.
/// Cost: one Philox4x32-10 block per 4 values. Value type; thread-safe.
struct uniform_init {
  std::uint64_t seed = 0;             ///< model seed
  float scale = 0.0f;                 ///< half-width `a` of the interval; 0 means 1/sqrt(dim)
  std::vector<float> table_scales{};  ///< per-table half-widths (override `scale` where > 0)

  /// A `table_scales` entry meaning "rows start at exactly zero".
  static constexpr float zeros = -1.0f;

  /// DLRM's initialisation: table t uniform on ±sqrt(1/rows[t]) (so the larger the table, the
  /// smaller its rows start: their sum over a batch stays small next to the dense features);
  /// tables without a row bound (rows 0, e.g. hash tables) get `unbounded_scale`.
  [[nodiscard]] static uniform_init for_rows(std::uint64_t seed,
                                             std::span<const std::uint64_t> rows,
                                             float unbounded_scale = 0.01f) {
    uniform_init init{seed, unbounded_scale, {}};
    init.table_scales.reserve(rows.size());
    for (const std::uint64_t r : rows)
      init.table_scales.push_back(
          r == 0 ? unbounded_scale : static_cast<float>(std::sqrt(1.0 / static_cast<double>(r))));
    return init;
  }

  /// The trainer's initialisation (trainer_options::embedding_init_scale): ±`scale` for every
  /// table when `scale` > 0, else `for_rows` (DLRM's ±sqrt(1/rows)); tables flagged in
  /// `zero_tables` (a model's `zero_initialised(t)`; empty: none) start at zero. The serving
  /// bundle rebuilds untouched rows with it, so both must agree.
  [[nodiscard]] static uniform_init for_training(std::uint64_t seed, float scale,
                                                 std::span<const std::uint64_t> rows,
                                                 const std::vector<bool>& zero_tables) {
    uniform_init result = scale > 0.0f ? uniform_init{seed, scale, {}} : for_rows(seed, rows);
    if (!zero_tables.empty()) {
      result.table_scales.resize(rows.size(), 0.0f);
      for (std::size_t t = 0; t < rows.size() && t < zero_tables.size(); ++t)
        if (zero_tables[t]) result.table_scales[t] = zeros;
    }
    return result;
  }

  /// Half-width of the interval used for rows of `dim` values of table `table`.
  [[nodiscard]] float bound(std::size_t table, std::size_t dim) const noexcept {
    if (table < table_scales.size() && table_scales[table] > 0.0f) return table_scales[table];
    if (table < table_scales.size() && table_scales[table] == zeros) return 0.0f;
    if (scale > 0.0f) return scale;
    return dim == 0 ? 0.0f : 1.0f / std::sqrt(static_cast<float>(dim));
  }

  /// Writes the initial values of row `key` of table `table` into `row` (its size is the dim).
  void fill(std::size_t table, std::uint64_t key, std::span<float> row) const noexcept {
    const float a = bound(table, row.size());
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
    return to_interval(rng.block(col / 4)[col % 4], bound(table, dim));
  }

 private:
  static float to_interval(std::uint32_t bits, float a) noexcept {
    if (a == 0.0f) return 0.0f;
    const float u = static_cast<float>(bits >> 8) * 0x1.0p-24f;
    return -a + 2.0f * a * u;
  }
};

}  // namespace strata

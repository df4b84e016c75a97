/// @file criteo_kaggle.hpp
/// Facts about the Criteo Kaggle display-advertising data set that model configurations use.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

namespace strata::models {

/// Row counts of the 26 categorical features of the Criteo Kaggle display-advertising data
/// set (as counted by DLRM's reference data loader), as a compile-time constant.
inline constexpr std::array<std::uint64_t, 26> criteo_kaggle_rows = {
    1460, 583,   10131227, 2202608, 305,  24,   12517, 633,     3,  93145, 5683,   8351593, 3194,
    27,   14992, 5461306,  10,      5652, 2173, 4,     7046547, 18, 15,    286181, 105,     142572};

/// The same row counts as a vector (what dlrm_config::table_rows holds).
inline const std::vector<std::uint64_t>& criteo_kaggle_table_rows() {
  static const std::vector<std::uint64_t> rows(criteo_kaggle_rows.begin(),
                                               criteo_kaggle_rows.end());
  return rows;
}

}  // namespace strata::models

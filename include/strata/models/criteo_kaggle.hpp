/// @file criteo_kaggle.hpp
/// Facts about the Criteo Kaggle display-advertising data set that model configurations use.
#pragma once

#include <cstdint>
#include <vector>

namespace strata::models {

/// Row counts of the 26 categorical features of the Criteo Kaggle display-advertising data
/// set (as counted by DLRM's reference data loader).
inline const std::vector<std::uint64_t>& criteo_kaggle_table_rows() {
  static const std::vector<std::uint64_t> rows = {
      1460,  583,  10131227, 2202608, 305, 24,     12517,   633,   3,
      93145, 5683, 8351593,  3194,    27,  14992,  5461306, 10,    5652,
      2173,  4,    7046547,  18,      15,  286181, 105,     142572};
  return rows;
}

}  // namespace strata::models

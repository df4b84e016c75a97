// The auto_trainer example of docs/ctr.md (CI compiles and runs it): DLRM's Kaggle shape picks
// parameter_server over embedding::sharded at compile time. Only the composition is checked
// here (the Kaggle tables are 2.16 GB); tests/train/test_auto_trainer.cpp trains small shapes.
#include <cstdio>
#include <string_view>
#include <type_traits>

#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/auto_trainer.hpp"

int main() {
  using kaggle = strata::models::static_dlrm<strata::models::criteo_kaggle_dlrm>;
  using chosen = strata::train::auto_trainer<kaggle, strata::optim::adagrad>;
  static_assert(
      std::is_same_v<chosen::storage_type,
                     strata::embedding::sharded<strata::optim::adagrad, strata::ps::sync>>);
  const bool ps = std::string_view(chosen::strategy_name) == "ps";
  std::printf("criteo_kaggle_dlrm: %llu MB of tables, %llu KB of MLPs -> %s\n",
              static_cast<unsigned long long>(kaggle::embedding_bytes >> 20),
              static_cast<unsigned long long>(kaggle::dense_bytes >> 10), chosen::strategy_name);
  return ps ? 0 : 1;
}

// Small CTR problems for the trainer's tests: a small DLRM / Wide & Deep configuration, a
// learnable in-memory data set (3 dense features, 4 sparse ones), and trainer options.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>

#include "strata/core/rng.hpp"
#include "strata/data/batch.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
#include "strata/train/options.hpp"

namespace strata_test {

inline strata::models::dlrm::config small_dlrm() {
  strata::models::dlrm::config c;
  c.dense_features = 3;
  c.sparse_features = 4;
  c.embedding_dim = 4;
  c.table_rows = {40, 50, 30, 60};
  c.bottom_mlp = {8, 4};
  c.top_mlp = {8, 1};
  return c;
}

inline strata::models::wide_deep::config small_wide_deep() {
  strata::models::wide_deep::config c;
  c.dense_features = 3;
  c.sparse_features = 4;
  c.deep_dim = 4;
  c.table_rows = {40, 50, 30, 60};
  c.deep_mlp = {8, 1};
  return c;
}

/// A small learnable CTR problem built in memory: the logit is linear in the dense features
/// plus a per-key term (keys ≡ 0 mod 3 push it up).
inline strata::data::ctr_dataset make_data(std::size_t n, std::uint64_t seed) {
  strata::data::ctr_dataset set(3, 4);
  const std::array<std::uint64_t, 4> rows = {40, 50, 30, 60};
  strata::counter_rng rng{seed, 7};
  for (std::size_t i = 0; i < n; ++i) {
    std::array<float, 3> dense{};
    std::array<std::uint64_t, 4> keys{};
    double logit = -0.5;
    for (std::size_t d = 0; d < 3; ++d) {
      dense[d] = rng.uniform(i * 16 + d, -1.0f, 1.0f);
      logit += 0.8 * dense[d] * (d == 1 ? -1 : 1);
    }
    for (std::size_t f = 0; f < 4; ++f) {
      keys[f] = rng.below(i * 16 + 4 + f, rows[f]);
      logit += (keys[f] % 3 == 0 ? 1.0 : -0.3);
    }
    const float label =
        rng.uniform_double(i * 16 + 9) < 1.0 / (1.0 + std::exp(-logit)) ? 1.0f : 0.0f;
    set.append(dense, keys, label);
  }
  return set;
}

inline strata::train::trainer_options base_options(int workers, std::size_t batch) {
  strata::train::trainer_options o;
  o.workers = workers;
  o.servers = 2;
  o.batch = batch;
  o.max_steps = 12;
  o.seed = 5;
  o.dense_row = 16;
  o.progress = false;
  o.timeout_seconds = 30;
  return o;
}

/// An empty scratch directory for checkpoints: <temp>/strata-test-<name>, removed if present.
inline std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir = std::filesystem::temp_directory_path() / ("strata-test-" + name);
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace strata_test

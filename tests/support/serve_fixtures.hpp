// Small serving problems shared by tests/serve and the ONNX parity program: Criteo-format data
// written as TSV and read back as training reads it, a small DLRM and Wide & Deep (13 dense, 26
// sparse features, 64-row tables, dim 4), the trainer options and strategies they train with,
// and the predictor's outputs for a data set in batches.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "strata/data/criteo.hpp"
#include "strata/data/synthetic.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/serve/bundle.hpp"
#include "strata/serve/predictor.hpp"
#include "strata/train/trainer.hpp"
#include "support/temp_dir.hpp"

namespace strata_test::serving {

inline constexpr std::uint64_t seed = 11;
inline constexpr std::uint64_t table_rows = 64;
inline constexpr std::size_t batch = 32;  // per worker: the trainer evaluates in batches of this

/// Criteo-format data written as TSV and read back as training reads it (ctr_train's hashing:
/// hash seed = the run's seed). The first `train_rows` lines train, the rest are held out.
struct criteo_data {
  static constexpr std::size_t train_rows = 3000, eval_rows = 1000;
  temp_dir dir{"serve_data"};
  strata::data::ctr_dataset train, eval;
  std::vector<std::string> eval_lines;

  criteo_data() {
    namespace data = strata::data;
    const auto path = dir.path / "data.tsv";
    data::synthetic_criteo gen;
    gen.rows = train_rows + eval_rows;
    gen.seed = seed;
    gen.distinct_ids = {40};
    data::write_synthetic_criteo(path, gen);
    const auto all = data::load_criteo(path, {.table_rows = {table_rows}, .hash_seed = seed});
    std::vector<std::size_t> first(train_rows), rest(eval_rows);
    std::iota(first.begin(), first.end(), std::size_t{0});
    std::iota(rest.begin(), rest.end(), train_rows);
    train.append(all.gather(first));
    eval.append(all.gather(rest));
    std::ifstream in(path);
    std::string line;
    for (std::size_t i = 0; std::getline(in, line); ++i)
      if (i >= train_rows) eval_lines.push_back(line);
  }
};

/// One data set per process (written and read once).
inline const criteo_data& shared_data() {
  static const criteo_data d;
  return d;
}

inline strata::models::dlrm::config dlrm_config() {
  strata::models::dlrm::config c;
  c.embedding_dim = 4;
  c.table_rows = {table_rows};
  c.bottom_mlp = {8, 4};
  c.top_mlp = {8, 1};
  return c;
}

inline strata::models::wide_deep::config wide_deep_config() {
  strata::models::wide_deep::config c;
  c.deep_dim = 4;
  c.table_rows = {table_rows};
  c.deep_mlp = {8, 1};
  return c;
}

/// 2 workers, 40 steps of `batch`, checkpointing the final state into `checkpoints`.
inline strata::train::trainer_options options(const std::filesystem::path& checkpoints,
                                              int servers) {
  strata::train::trainer_options o;
  o.workers = 2;
  o.servers = servers;
  o.batch = batch;
  o.max_steps = 40;
  o.seed = seed;
  o.dense_row = 16;
  o.progress = false;
  o.timeout_seconds = 30;
  o.checkpoint_dir = checkpoints;
  o.checkpoint_every = 40;  // the final state
  return o;
}

using ps_dlrm =
    strata::train::trainer<strata::models::dlrm, strata::embedding::sharded<strata::optim::adagrad>,
                           strata::train::parameter_server<strata::ps::sync>>;
using allreduce_dlrm =
    strata::train::trainer<strata::models::dlrm, strata::embedding::local<strata::optim::adagrad>,
                           strata::comm::ring_allreduce>;
using allreduce_wide_deep = strata::train::trainer<strata::models::wide_deep,
                                                   strata::embedding::local<strata::optim::adagrad>,
                                                   strata::comm::ring_allreduce>;

/// The predictor's logits (or probabilities) for a data set, in batches of `per_call`.
template <class Model>
std::vector<float> run(const strata::serve::predictor<Model>& p,
                       const strata::data::ctr_dataset& set, std::size_t per_call,
                       bool logits = true) {
  std::vector<float> out(set.size());
  strata::data::ctr_batch b;
  std::vector<std::size_t> idx;
  for (std::size_t first = 0; first < set.size(); first += per_call) {
    const std::size_t n = std::min(per_call, set.size() - first);
    idx.resize(n);
    std::iota(idx.begin(), idx.end(), first);
    set.gather(idx, b);
    const std::span<float> into(out.data() + first, n);
    if (logits)
      p.predict_logits(b.dense.view(), b.keys.view(), into);
    else
      p.predict(b.dense.view(), b.keys.view(), into);
  }
  return out;
}

/// Bundles of the small models trained on shared_data() (allreduce, 40 steps), written into
/// a temporary directory: DLRM with fp32 and int8 rows, Wide & Deep with fp32 and fp16 rows.
struct trained_bundles {
  temp_dir dir{"serve_bundles"};
  std::filesystem::path dlrm_fp32, dlrm_int8, wide_deep_fp32, wide_deep_fp16;

  trained_bundles() {
    namespace serve = strata::serve;
    const auto& d = shared_data();
    strata::optim::adagrad opt;
    opt.lr = 0.05f;
    auto o = options({}, 0);  // no checkpoints: the bundles come from the trainers
    o.checkpoint_every = 0;
    allreduce_dlrm dlrm_run(dlrm_config(), opt, o);
    dlrm_run.fit(d.train);
    allreduce_wide_deep wd_run(wide_deep_config(), opt, o);
    wd_run.fit(d.train);
    const auto write = [&](const auto& trainer, const auto& config, const char* name,
                           serve::precision rows) {
      serve::export_options e;
      e.rows = rows;
      serve::export_trainer(trainer, config, dir.path / name, e, 40);
      return dir.path / name;
    };
    dlrm_fp32 = write(dlrm_run, dlrm_config(), "dlrm-fp32", serve::precision::fp32);
    dlrm_int8 = write(dlrm_run, dlrm_config(), "dlrm-int8", serve::precision::int8);
    wide_deep_fp32 = write(wd_run, wide_deep_config(), "wide_deep-fp32", serve::precision::fp32);
    wide_deep_fp16 = write(wd_run, wide_deep_config(), "wide_deep-fp16", serve::precision::fp16);
  }
};

}  // namespace strata_test::serving

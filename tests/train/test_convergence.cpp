// Convergence on synthetic Criteo-format data with a known teacher: written as TSV, read back
// through the Criteo reader, trained with the hybrid strategy.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>

#include "strata/compress/error_feedback.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/data/criteo.hpp"
#include "strata/data/synthetic.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"
#include "support/skip.hpp"

using namespace strata;

namespace {
template <class Compressor>
using hybrid_trainer = train::trainer<models::dlrm, embedding::sharded<optim::adagrad>,
                                      train::hybrid<ps::sync>, Compressor>;
}

TEST_CASE("DLRM reaches the teacher's AUC; int8 with error feedback matches fp32",
          "[train][convergence]") {
  if (std::getenv("STRATA_SANITIZED") != nullptr) {
    strata_test::skip("sanitizer build: the convergence run is left to the plain build");
    return;
  }
  const auto file = std::filesystem::temp_directory_path() / "strata-test-convergence.tsv";
  data::synthetic_criteo gen;
  gen.rows = 90'000;
  gen.seed = 11;
  gen.distinct_ids = {40};
  gen.dense_scale = 0.0;  // the teacher is a sum of per-id weights: learnable from ids alone
  const auto teacher = data::write_synthetic_criteo(file, gen);
  data::criteo_options reader;
  reader.table_rows = {4096};
  const auto all = data::load_criteo(file, reader);
  std::filesystem::remove(file);
  std::vector<std::size_t> train_idx(80'000), eval_idx(10'000);
  std::iota(train_idx.begin(), train_idx.end(), std::size_t{0});
  std::iota(eval_idx.begin(), eval_idx.end(), std::size_t{80'000});
  const auto train_set = all.gather(train_idx);
  data::ctr_dataset train_data, eval_data;
  train_data.append(train_set);
  eval_data.append(all.gather(eval_idx));

  models::dlrm::config model;
  model.table_rows = {4096};
  model.bottom_mlp = {32, 16};
  model.top_mlp = {32, 1};
  train::trainer_options options;
  options.workers = 2;
  options.servers = 1;
  options.batch = 128;
  options.epochs = 2;
  options.progress = false;
  const optim::adagrad opt{.lr = 0.03f};

  const auto fp32 =
      hybrid_trainer<compress::identity>(model, opt, options).fit(train_data, &eval_data);
  const auto int8 =
      hybrid_trainer<compress::error_feedback<compress::int8_block<256>>>(model, opt, options)
          .fit(train_data, &eval_data);
  INFO("teacher " << teacher.teacher_auc << " fp32 " << fp32.evals.back().auc << " int8 "
                  << int8.evals.back().auc);
  // Measured: 0.820 against a teacher of 0.842 (DLRM sees ids only through dot products).
  CHECK(fp32.evals.back().auc >= teacher.teacher_auc - 0.03);
  CHECK(int8.evals.back().auc >= fp32.evals.back().auc - 0.003);
}

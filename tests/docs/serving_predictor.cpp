// The ten-line program of docs/serving.md (CI compiles and runs it): open an inference bundle
// and answer raw Criteo TSV lines. The setup first does what `ctr_train --tiny --export
// serving-bundle` does (train a small DLRM, export its final state) and keeps the trainer's
// evaluation of the request lines; the program's answers must score the same.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "strata/data/criteo.hpp"
#include "strata/data/synthetic.hpp"
#include "strata/embedding/local.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/serve.hpp"
#include "strata/train/evaluation.hpp"
#include "strata/train/trainer.hpp"

namespace {

/// Trains a small DLRM on synthetic Criteo lines, exports it to serving-bundle/, writes the
/// held-out lines to serving-requests.tsv and returns the trainer's eval AUC on them.
double make_bundle() {
  using namespace strata;
  data::write_synthetic_criteo("serving-all.tsv", {.rows = 4000, .seed = 3, .distinct_ids = {100}});
  std::ifstream all("serving-all.tsv");
  std::ofstream train_lines("serving-train.tsv"), requests("serving-requests.tsv");
  std::string line;
  for (int i = 0; std::getline(all, line); ++i)
    (i < 3000 ? train_lines : requests) << line << '\n';
  train_lines.close();
  requests.close();
  train::trainer_options options;  // ctr_train's hashing: hash seed = the run's seed
  options.workers = 1;
  options.batch = 100;
  options.epochs = 2;
  options.progress = false;
  const data::criteo_options hashing{.table_rows = {1000}, .hash_seed = options.seed};
  const auto train_set = data::load_criteo("serving-train.tsv", hashing);
  const auto eval_set = data::load_criteo("serving-requests.tsv", hashing);
  models::dlrm::config model;
  model.table_rows = {1000};
  model.bottom_mlp = {32, 16};
  model.top_mlp = {32, 1};
  train::trainer<models::dlrm, embedding::local<optim::adagrad>, comm::ring_allreduce> trainer(
      model, optim::adagrad{.lr = 0.03f}, options);
  const auto report = trainer.fit(train_set, &eval_set);
  serve::export_options overwrite;
  overwrite.overwrite = true;
  serve::export_trainer(trainer, model, "serving-bundle", overwrite, report.steps);
  return report.evals.back().auc;
}

}  // namespace

int main() {
  const double trainer_auc = make_bundle();

  // --- docs/serving.md: answer raw Criteo lines from a bundle ---
  strata::serve::predictor<strata::models::dlrm> model("serving-bundle");  // mmap + checks
  std::ifstream requests("serving-requests.tsv");
  std::vector<std::string> lines;
  for (std::string line; std::getline(requests, line);)
    lines.push_back(line);
  const std::vector<std::string_view> batch(lines.begin(), lines.end());
  std::vector<float> p(batch.size());
  model.predict_lines(batch, p);  // parsed and hashed as in training
  for (std::size_t i = 0; i < 3; ++i)
    std::printf("request %zu: click probability %.4f\n", i, p[i]);
  // --- end of the docs/serving.md program ---

  // The answers score as the trainer's evaluation did (one batch here, batches of 100 there:
  // the logits agree to float rounding, the AUC to well under 1e-4).
  const auto labels = strata::data::load_criteo(
      "serving-requests.tsv",
      {.table_rows = model.manifest().hash_rows, .hash_seed = model.manifest().hash_seed});
  std::vector<float> logits(p.size());
  for (std::size_t i = 0; i < p.size(); ++i)
    logits[i] = std::log(p[i] / (1.0f - p[i]));
  const double auc = strata::train::score_predictions(logits, labels.labels(), 0).auc;
  std::printf("predictor AUC %.6f, trainer's evaluation %.6f\n", auc, trainer_auc);
  return std::abs(auc - trainer_auc) < 1e-4 ? 0 : 1;
}

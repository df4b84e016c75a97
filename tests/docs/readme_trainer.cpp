// The quick-start snippet of README.md (CI compiles and runs it): the distribution strategy is
// a type; swapping `train::hybrid<ps::sync>` for `comm::ring_allreduce` (with
// embedding::local storage) or `train::parameter_server<ps::sync>` is a one-line change.
#include <cstdio>

#include "strata/compress/error_feedback.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/data/criteo.hpp"
#include "strata/data/synthetic.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"

using namespace strata;

using my_trainer = train::trainer<
    models::dlrm,                                                  // model
    embedding::sharded<optim::adagrad>,                            // embeddings on parameter servers
    train::hybrid<ps::sync>,                                       // dense part by ring allreduce
    compress::error_feedback<compress::int8_block<256>>>;          // int8 on the wire

int main() {
  // Criteo-format data: a real file works the same way (data::load_criteo("train.tsv", ...)).
  data::synthetic_criteo synthetic{.rows = 6000, .seed = 7, .distinct_ids = {100}};
  const auto teacher = data::write_synthetic_criteo("readme_trainer.tsv", synthetic);
  const auto all = data::load_criteo("readme_trainer.tsv", {.table_rows = {1000}});

  models::dlrm::config model;            // the Criteo Kaggle DLRM, with smaller tables and MLPs
  model.table_rows = {1000};
  model.bottom_mlp = {32, 16};
  model.top_mlp = {32, 1};
  train::trainer_options options;        // 4 workers + 2 servers as threads of this process
  options.batch = 64;
  options.epochs = 2;
  options.progress = false;

  my_trainer trainer(model, optim::adagrad{.lr = 0.03f}, options);
  const auto report = trainer.fit(all, &all);
  std::printf("%s: %zu steps, eval AUC %.3f (teacher %.3f)\n", report.strategy.c_str(),
              report.steps, report.evals.back().auc, teacher.teacher_auc);
  return report.evals.back().auc > 0.6 ? 0 : 1;
}

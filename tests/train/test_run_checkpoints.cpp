// The pieces the trainer's step loop calls around the steps, on their own: run_checkpoints
// (when a checkpoint is due, the staged write over a world of ranks, rotation, the checks
// before a resume, which residuals carry over), checkpoint_files, and evaluation's
// `evaluate` / `training_metrics` against a plain computation.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strata/comm/thread_world.hpp"
#include "strata/data/batch.hpp"
#include "strata/data/metrics.hpp"
#include "strata/train/evaluation.hpp"
#include "strata/train/run_checkpoints.hpp"
#include "support/temp_dir.hpp"

using namespace strata;
namespace fs = std::filesystem;

namespace {

train::trainer_options with_dir(const fs::path& dir, std::size_t every) {
  train::trainer_options o;
  o.checkpoint_dir = dir;
  o.checkpoint_every = every;
  return o;
}

/// The identity of a small run whose checkpoint has a replica and `servers` stripes.
train::checkpoint_meta meta_of(std::size_t step, int workers, int servers) {
  return {.step = step,
          .dense_count = 10,
          .dense_row = 4,
          .seed = 7,
          .workers = workers,
          .optimizer = "sgd",
          .dense_optimizer = "sgd",
          .strategy = "hybrid",
          .tables = "C1 100 4\n",
          .files =
              train::checkpoint_files{
                  .replica = true, .residuals = true, .workers = workers, .servers = servers}
                  .names(),
          .seals = {},
          .run_id = 0};
}

}  // namespace

TEST_CASE("checkpoint_files lists each holder's file", "[train][checkpoint]") {
  using files = train::checkpoint_files;
  CHECK(files{}.names().empty());
  CHECK(files{.replica = true, .workers = 2}.names() ==
        std::vector<std::string>{"rows-worker-0.ckpt"});
  CHECK(files{.replica = false, .residuals = true, .workers = 2, .servers = 1}.names() ==
        std::vector<std::string>{"worker-0.ckpt", "worker-1.ckpt", "rows-server-0.ckpt"});
  CHECK(files::identity() == "state.ckpt");
}

TEST_CASE(
    "run_checkpoints: segments end at checkpoint steps; a checkpoint is due there and at "
    "the end",
    "[train][checkpoint]") {
  const train::run_checkpoints none(train::trainer_options{});
  CHECK_FALSE(none.enabled());
  CHECK(none.segment_end(3, 100) == 100);
  CHECK_FALSE(none.due(100, 100));

  const train::run_checkpoints at_end(with_dir("/tmp/unused", 0));
  CHECK(at_end.segment_end(3, 100) == 100);
  CHECK(at_end.due(100, 100));
  CHECK_FALSE(at_end.due(50, 100));

  const train::run_checkpoints every(with_dir("/tmp/unused", 25));
  CHECK(every.segment_end(0, 100) == 25);
  CHECK(every.segment_end(25, 100) == 50);
  CHECK(every.segment_end(90, 95) == 95);
  CHECK(every.due(50, 100));
  CHECK_FALSE(every.due(51, 100));
  CHECK(every.due(95, 95));
  CHECK_FALSE(every.resuming());
}

TEST_CASE(
    "run_checkpoints writes every rank's part, publishes whole checkpoints, keeps two and "
    "names the last good one",
    "[train][checkpoint]") {
  const strata_test::temp_dir tmp("run_checkpoints");
  const fs::path dir = tmp.path / "ckpt";
  const train::run_checkpoints checkpoints(with_dir(dir, 10));
  CHECK_THAT(checkpoints.last_good(), Catch::Contains("No checkpoint was written"));
  auto lock = checkpoints.claim();
  REQUIRE(lock.has_value());

  // 2 workers and 1 dedicated server: each rank writes the files it holds (their content
  // names the step, so the files of two checkpoints differ).
  const auto part = [](std::size_t step) {
    train::checkpoint_writer out;
    out.add_value("step", std::uint64_t{step});
    return out;
  };
  comm::thread_world world(3, {.timeout_seconds = 20});
  world.run([&](comm::thread_transport& t) {
    for (std::size_t step : {10, 20, 30}) {
      checkpoints.write(t, step, meta_of(step, 2, 1), [&](const fs::path& staged) {
        CHECK(fs::is_directory(staged));  // every rank sees the staging folder
        if (t.rank() == 0) part(step).commit(staged / "rows-worker-0.ckpt");
        if (t.rank() < 2)
          part(step).commit(staged / ("worker-" + std::to_string(t.rank()) + ".ckpt"));
        if (t.rank() == 2) part(step).commit(staged / "rows-server-0.ckpt");
      });
    }
  });
  CHECK(checkpoints.last_step() == 30);
  CHECK_THAT(checkpoints.last_good(), Catch::Contains((dir / "step-30").string()));
  CHECK_FALSE(fs::exists(dir / "step-10"));  // rotated away: two are kept
  CHECK(fs::exists(dir / "step-20"));
  CHECK_FALSE(fs::exists(dir / "step-30.tmp"));
  // state.ckpt seals every file (size + stored checksum) and names the run.
  const auto sealed = train::checkpoint_meta::read(dir / "step-30" / "state.ckpt");
  REQUIRE(sealed.seals.size() == sealed.files.size());
  for (std::size_t i = 0; i < sealed.files.size(); ++i)
    CHECK(sealed.seals[i] == train::seal_of(dir / "step-30" / sealed.files[i]));
  CHECK(sealed.run_id == checkpoints.run_id());
  CHECK(sealed.run_id != 0);
  CHECK(checkpoints.open(dir / "step-30", meta_of(0, 2, 1)).step == 30);
  // A file of another checkpoint copied in (same name, whole and valid on its own) is refused
  // before anything loads.
  fs::copy_file(dir / "step-20" / "worker-1.ckpt", dir / "step-30" / "worker-1.ckpt",
                fs::copy_options::overwrite_existing);
  CHECK_THROWS_WITH(checkpoints.open(dir / "step-30", meta_of(0, 2, 1)),
                    Catch::Contains("worker-1.ckpt is not the file this checkpoint wrote"));

  // Another job cannot claim the directory while this run holds it; once released, a fresh
  // run into the used directory is refused and a resume reads `latest`.
  CHECK_THROWS_WITH(train::run_checkpoints(with_dir(dir, 10)).claim(),
                    Catch::Contains("is in use by another job"));
  lock.reset();
  CHECK_THROWS_WITH(train::run_checkpoints(with_dir(dir, 10)).claim(),
                    Catch::Contains("already holds checkpoints"));
  auto resume = with_dir(dir, 10);
  resume.resume = true;
  const train::run_checkpoints resumed(resume);
  CHECK(resumed.resuming());
  CHECK(resumed.latest() == dir / "step-30");
}

TEST_CASE(
    "run_checkpoints::open refuses another run's checkpoint or an incomplete one; "
    "residuals carry over only at the same worker count",
    "[train][checkpoint]") {
  const strata_test::temp_dir tmp("run_checkpoints_open");
  const fs::path at = tmp.path / "step-5";
  fs::create_directories(at);
  const auto saved = meta_of(5, 2, 1);
  saved.write(at / "state.ckpt");
  for (const auto& name : saved.files)
    train::checkpoint_writer{}.commit(at / name);
  const train::run_checkpoints checkpoints(with_dir(tmp.path, 0));

  const auto opened = checkpoints.open(at, meta_of(0, 4, 2));  // other placement: fine
  CHECK(opened.step == 5);
  auto other_seed = meta_of(0, 2, 1);
  other_seed.seed = 8;
  CHECK_THROWS_WITH(checkpoints.open(at, other_seed), Catch::Contains("seed 7"));

  CHECK(train::run_checkpoints::residuals(at, opened, 1, 2).has_value());
  CHECK_FALSE(train::run_checkpoints::residuals(at, opened, 1, 3).has_value());

  fs::remove(at / "worker-1.ckpt");
  CHECK_THROWS_WITH(checkpoints.open(at, meta_of(0, 2, 1)),
                    Catch::Contains("worker-1.ckpt (listed in state.ckpt) is missing"));

  checkpoints.resumed(1, at, opened);
  CHECK(checkpoints.last_step() == 5);
  CHECK(opened.run_id == 0);  // written without one (by meta_of): the run keeps its own
  CHECK(checkpoints.run_id() != 0);
  auto named = saved;
  named.run_id = 0x1234;
  checkpoints.resumed(1, at, named);
  CHECK(checkpoints.run_id() == 0x1234);  // continuations share the id
}

TEST_CASE("evaluate scores every row once in file order, in batches, up to max_samples",
          "[train][evaluation]") {
  data::ctr_dataset set(1, 1);
  std::vector<float> all_logits, all_labels;
  for (int i = 0; i < 23; ++i) {
    const float logit = static_cast<float>(std::sin(0.7 * i));
    const float label = i % 3 == 0 ? 1.0f : 0.0f;
    const std::uint64_t key = static_cast<std::uint64_t>(i);
    set.append(std::span(&logit, 1), std::span(&key, 1), label);
    all_logits.push_back(logit);
    all_labels.push_back(label);
  }
  data::ctr_batch scratch;
  std::size_t calls = 0;
  const auto predict = [&](const data::ctr_batch& rows, std::span<float> logits) {
    REQUIRE(logits.size() == rows.size());
    ++calls;
    for (std::size_t i = 0; i < rows.size(); ++i)
      logits[i] = rows.dense(i, 0);  // the "model" returns the dense value
  };
  const auto whole = train::evaluate(set, 5, 0, 12, scratch, predict);
  const auto expected = train::score_predictions(all_logits, all_labels, 12);
  CHECK(calls == 5);  // 23 rows in batches of 5
  CHECK(whole.samples == 23);
  CHECK(whole.step == 12);
  CHECK(whole.auc == expected.auc);
  CHECK(whole.logloss == expected.logloss);
  CHECK(whole.accuracy == expected.accuracy);

  const auto first = train::evaluate(set, 4, 10, 0, scratch, predict);
  const auto expected_first =
      train::score_predictions(std::span(all_logits).first(10), std::span(all_labels).first(10), 0);
  CHECK(first.samples == 10);
  CHECK(first.auc == expected_first.auc);
  CHECK_THROWS_WITH(train::evaluate(set, 0, 0, 0, scratch, predict),
                    Catch::Contains("batch size must be positive"));
}

TEST_CASE("training_metrics: mean loss per row and the AUC of the segment's rows",
          "[train][evaluation]") {
  train::training_metrics m;
  CHECK(m.mean_loss() == 0.0);
  CHECK_FALSE(m.auc().has_value());
  const std::vector<float> logits = {0.1f, -0.3f, 0.8f}, labels = {1, 0, 0};
  m.add(3.0, logits, labels);
  m.add(1.0, std::span(logits).first(1), std::span(labels).first(1));
  CHECK(m.mean_loss() == Approx(1.0));
  std::vector<float> l2 = logits, y2 = labels;
  l2.push_back(0.1f);
  y2.push_back(1.0f);
  REQUIRE(m.auc().has_value());
  CHECK(*m.auc() == data::auc(l2, y2));
  m.reset();
  CHECK(m.loss_count == 0);
  CHECK(m.logits.empty());
  m.add(1.0, std::span(logits).last(2), std::span(labels).last(2));  // one class only
  CHECK_FALSE(m.auc().has_value());
}

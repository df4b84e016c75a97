// train::divergence_guard on its own (what is not finite; the blow-up warning's warm-up, factor
// and quiet period) and through the trainer (worker 0 logs the warning line, once per quiet
// period).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/sgd.hpp"
#include "strata/train/divergence_guard.hpp"
#include "strata/train/trainer.hpp"
#include "support/ctr_fixtures.hpp"

using namespace strata;

TEST_CASE("divergence_guard names the first non-finite value of a step", "[train][divergence]") {
  const std::vector<table_spec> tables = {{"C1", 10, 2}, {"C2", 10, 2}};
  std::vector<std::vector<std::uint64_t>> keys = {{4, 5}, {7, 8}};
  std::vector<matrix<float>> grads;
  grads.emplace_back(2, 2);
  grads.emplace_back(2, 2);
  std::vector<float> dense(5, 0.5f);
  const auto check = [&](double loss) {
    return train::divergence_guard::first_non_finite(loss, dense, tables, keys, grads);
  };
  CHECK(check(1.0).empty());
  CHECK(check(std::nan("")) == "the loss is nan");
  grads[1](1, 0) = std::numeric_limits<float>::infinity();
  CHECK(check(1.0) == "the gradient of table 1 ('C2') row of key 8 is inf");
  dense[3] = -std::numeric_limits<float>::infinity();
  CHECK(check(1.0) == "dense gradient 3 is -inf");  // dense before rows
  CHECK(check(std::numeric_limits<double>::infinity()) == "the loss is inf");
}

TEST_CASE("divergence_guard warns of a blow-up after its warm-up, once per quiet period",
          "[train][divergence]") {
  train::divergence_guard guard(10.0, 20, 100);
  CHECK_FALSE(guard.observe(1.0, 0));
  CHECK_FALSE(guard.observe(50.0, 1));  // within the warm-up: no mean to trust yet
  for (std::size_t s = 2; s < 150; ++s)
    CHECK_FALSE(guard.observe(1.0, s));
  REQUIRE(guard.running_mean() == Approx(1.0).epsilon(0.01));
  CHECK_FALSE(guard.observe(9.0, 150));  // below 10x
  const auto warning = guard.observe(30.0, 151);
  REQUIRE(warning);
  CHECK(warning->find("step 152 loss 30") != std::string::npos);
  CHECK(warning->find("the run may be diverging") != std::string::npos);
  for (std::size_t s = 152; s < 251; ++s)
    CHECK_FALSE(guard.observe(s % 10 == 5 ? 1000.0 : 1.0, s));  // quiet until step 251
  CHECK(guard.observe(5000.0, 251));
  train::divergence_guard off(0.0);
  for (std::size_t s = 0; s < 50; ++s)
    CHECK_FALSE(off.observe(s == 30 ? 1e9 : 1.0, s));
}

TEST_CASE("the trainer's worker 0 logs the blow-up warning, once per 100 steps",
          "[train][divergence]") {
  const auto data = strata_test::make_data(3000, 41);
  optim::adagrad opt;
  opt.lr = 0.05f;
  auto options = strata_test::base_options(2, 16);
  options.max_steps = 90;
  options.blowup_warn_factor = 1.000001;  // any rise above the running mean warns
  train::trainer<models::dlrm, embedding::local<optim::adagrad>, comm::ring_allreduce> trainer(
      strata_test::small_dlrm(), opt, options);
  // Capture stderr (log_line's stream) in a file around the run.
  const auto dir = strata_test::fresh_dir("blowup-log");
  std::filesystem::create_directories(dir);
  const auto path = dir / "stderr.txt";
  std::fflush(stderr);
  const int saved = dup(STDERR_FILENO);
  REQUIRE(saved >= 0);
  FILE* capture = std::fopen(path.c_str(), "w");
  REQUIRE(capture != nullptr);
  dup2(fileno(capture), STDERR_FILENO);
  const auto report = trainer.fit(data);
  std::fflush(stderr);
  dup2(saved, STDERR_FILENO);
  close(saved);
  std::fclose(capture);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string log = text.str();
  REQUIRE(report.steps == 90);
  std::size_t warnings = 0;
  for (std::size_t at = log.find("the run may be diverging"); at != std::string::npos;
       at = log.find("the run may be diverging", at + 1))
    ++warnings;
  INFO(log);
  CHECK(warnings == 1);  // 90 steps: one warning, then quiet; worker 1 logs none
}

TEST_CASE("divergence_policy::skip_batch drops a poisoned batch, counts it and trains on",
          "[train][divergence]") {
  // 1536 samples = 48 global batches of 2 × 16: sample 700 (a NaN dense feature) is in exactly
  // one batch per epoch.
  const auto clean = strata_test::make_data(1536, 42);
  const auto eval = strata_test::make_data(400, 43);
  data::ctr_batch all;
  std::vector<std::size_t> indices(clean.size());
  for (std::size_t i = 0; i < indices.size(); ++i)
    indices[i] = i;
  clean.gather(indices, all);
  all.dense(700, 1) = std::numeric_limits<float>::quiet_NaN();
  data::ctr_dataset poisoned(clean.dense_cols(), clean.sparse_cols());
  poisoned.append(all);

  optim::adagrad opt;
  opt.lr = 0.05f;
  auto options = strata_test::base_options(2, 16);
  options.max_steps = 0;
  options.epochs = 2;
  const auto check_strategy = [&]<class Trainer>(std::type_identity<Trainer>) {
    const auto reference = Trainer(strata_test::small_dlrm(), opt, options).fit(clean, &eval);
    REQUIRE_THROWS_WITH(Trainer(strata_test::small_dlrm(), opt, options).fit(poisoned),
                        Catch::Contains("the loss is") && Catch::Contains("nan"));
    auto skipping = options;
    skipping.on_divergence = train::divergence_policy::skip_batch;
    Trainer trainer(strata_test::small_dlrm(), opt, skipping);
    const auto report = trainer.fit(poisoned, &eval);
    CHECK(report.steps == 96);
    CHECK(report.skipped_batches == 2);  // one per epoch
    CHECK(report.dense_checksum != reference.dense_checksum);
    for (float v : trainer.dense_parameters())
      REQUIRE(std::isfinite(v));
    std::size_t rows = 0;
    trainer.for_each_embedding_row(
        [&](std::size_t, std::uint64_t, std::span<const float> row, std::span<const float> st) {
          ++rows;
          for (float v : row)
            REQUIRE(std::isfinite(v));
          for (float v : st)
            REQUIRE(std::isfinite(v));
        });
    CHECK(rows > 0);
    CHECK(std::isfinite(report.train_loss));
    CHECK(report.evals.back().auc == Approx(reference.evals.back().auc).margin(0.02));
  };
  SECTION("allreduce") {
    check_strategy(std::type_identity<train::trainer<models::dlrm, embedding::local<optim::adagrad>,
                                                     comm::ring_allreduce>>{});
  }
  SECTION("parameter servers") {
    check_strategy(
        std::type_identity<train::trainer<models::dlrm, embedding::sharded<optim::adagrad>,
                                          train::parameter_server<ps::sync>>>{});
  }
}

TEST_CASE("skip_batch stops when a worker's steps stay non-finite: the model itself diverged",
          "[train][divergence]") {
  const auto data = strata_test::make_data(2000, 44);
  optim::sgd absurd;
  absurd.lr = 1e30f;  // the weights overflow after the first steps; every later loss is NaN
  auto options = strata_test::base_options(2, 16);
  options.max_steps = 60;
  options.on_divergence = train::divergence_policy::skip_batch;
  train::trainer<models::dlrm, embedding::local<optim::sgd>, comm::ring_allreduce> trainer(
      strata_test::small_dlrm(), absurd, options);
  REQUIRE_THROWS_WITH(trainer.fit(data), Catch::Contains("training diverged at step") &&
                                             Catch::Contains("batches before it were dropped "
                                                             "too") &&
                                             Catch::Contains("no longer finite"));
}

TEST_CASE(
    "divergence_response: stop names the step and the last good checkpoint; skip drops "
    "until ten in a row",
    "[train][divergence]") {
  const auto last_good = [] { return std::string("The last good checkpoint is X."); };
  SECTION("stop") {
    train::divergence_response stop(train::divergence_policy::stop, 0, 3);
    CHECK_FALSE(stop.drop("", 0.5, 0, last_good));
    try {
      (void)stop.drop("the loss is nan", 0.5, 41, last_good);
      FAIL("a non-finite step under divergence_policy::stop must throw");
    } catch (const strata::error& e) {
      CHECK(e.code() == errc::diverged);
      const std::string what = e.what();
      CHECK_THAT(what, Catch::Contains("at step 42 on worker 3: the loss is nan"));
      CHECK_THAT(what, Catch::Contains("The last good checkpoint is X."));
      CHECK_THAT(what, !Catch::Contains("dropped too"));
    }
    CHECK(stop.skipped() == 0);
  }
  SECTION("skip") {
    train::divergence_response skip(train::divergence_policy::skip_batch, 0, 0);
    CHECK(skip.drop("dense gradient 1 is inf", 0.5, 0, last_good));
    CHECK_FALSE(skip.drop("", 0.5, 1, last_good));  // a finite step resets the run of drops
    for (std::size_t s = 2; s < 2 + train::divergence_response::max_in_a_row - 1; ++s)
      CHECK(skip.drop("the loss is nan", 0.5, s, last_good));
    CHECK(skip.skipped() == train::divergence_response::max_in_a_row);
    CHECK_THROWS_WITH(skip.drop("the loss is nan", 0.5, 99, last_good),
                      Catch::Contains("batches before it were dropped too"));
  }
}

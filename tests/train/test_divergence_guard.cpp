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
#include <vector>

#include "strata/embedding/local.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
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

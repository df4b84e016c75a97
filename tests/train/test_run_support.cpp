// What the trainer delegates: the checkpoint directory (staging, publishing, rotation, latest),
// evaluation scores, the in-process world's options and a co-located server's thread.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "strata/data/metrics.hpp"
#include "strata/train/checkpoint_dir.hpp"
#include "strata/train/evaluation.hpp"
#include "strata/train/launch.hpp"
#include "support/ctr_fixtures.hpp"

using namespace strata;
namespace fs = std::filesystem;

TEST_CASE("checkpoint_directory publishes staged checkpoints and keeps the newest",
          "[train][checkpoint]") {
  const fs::path dir = strata_test::fresh_dir("checkpoint_directory");
  const train::checkpoint_directory ckpt(dir);
  REQUIRE(ckpt.steps().empty());
  REQUIRE_THROWS_WITH(ckpt.latest(), Catch::Contains("no checkpoint to resume from"));
  REQUIRE_THROWS_WITH(ckpt.publish(5), Catch::Contains("nothing staged for step 5"));
  for (std::size_t step : {10u, 20u, 30u}) {
    ckpt.prepare(step);
    std::ofstream(ckpt.staging(step) / "state.ckpt") << step;
    ckpt.publish(step, 2);
  }
  ckpt.prepare(40);  // staged, never published: not a checkpoint
  REQUIRE(ckpt.steps() == std::vector<std::size_t>{20, 30});
  REQUIRE(ckpt.latest() == dir / "step-30");
  REQUIRE(fs::exists(dir / "step-30" / "state.ckpt"));
  REQUIRE(!fs::exists(dir / "step-10"));
  // A checkpoint folder itself can be named to resume from.
  REQUIRE(train::checkpoint_directory(dir / "step-20").latest() == dir / "step-20");
  // `latest` naming a checkpoint that is gone.
  fs::remove_all(dir / "step-30");
  REQUIRE_THROWS_WITH(ckpt.latest(), Catch::Contains("names step-30, which does not exist"));
  REQUIRE_THROWS_AS(train::checkpoint_directory(""), strata::error);
  fs::remove_all(dir);
}

TEST_CASE("score_predictions: AUC, logloss and accuracy of logits against labels",
          "[train][evaluation]") {
  const std::vector<float> logits{2.0f, -1.0f, 0.5f, -3.0f, 1.0f, -0.2f};
  const std::vector<float> labels{1, 0, 0, 0, 1, 1};
  const auto point = train::score_predictions(logits, labels, 17);
  REQUIRE(point.step == 17);
  REQUIRE(point.samples == 6);
  REQUIRE(point.auc == Approx(data::auc(logits, labels)));
  // Float64 reference for the logloss and the accuracy.
  double loss = 0;
  int right = 0;
  for (std::size_t i = 0; i < logits.size(); ++i) {
    const double p = 1.0 / (1.0 + std::exp(-double(logits[i])));
    loss -= labels[i] == 1 ? std::log(p) : std::log(1 - p);
    right += (p >= 0.5) == (labels[i] == 1);
  }
  REQUIRE(point.logloss == Approx(loss / 6).epsilon(1e-5));
  REQUIRE(point.accuracy == Approx(right / 6.0));
  // One class only: AUC is undefined and reported as 0.5.
  const std::vector<float> ones(6, 1.0f);
  REQUIRE(train::score_predictions(logits, ones, 0).auc == 0.5);
  REQUIRE(train::score_predictions({}, {}, 3).samples == 0);
  REQUIRE_THROWS_WITH(train::score_predictions(logits, std::span(labels).first(5), 0),
                      Catch::Contains("6 predictions for 5 labels"));
}

TEST_CASE("world_options_for maps stragglers and the injected fault onto the world",
          "[train][launch]") {
  train::trainer_options options;
  options.timeout_seconds = 12;
  options.send_delay_seconds = {0, 0.5, 0};
  options.fail_rank = 2;
  options.fail_on_send = 9;
  const auto wo = train::world_options_for(options, 3);
  REQUIRE(wo.timeout_seconds == 12);
  REQUIRE(wo.send_delay_seconds == std::vector<double>{0, 0.5, 0});
  REQUIRE(wo.fail_on_send == std::vector<std::uint64_t>{0, 0, 9});
  options.fail_rank = 3;
  REQUIRE_THROWS_WITH(train::world_options_for(options, 3),
                      Catch::Contains("fail_rank 3 outside the 3 ranks"));
  options.fail_on_send = 0;  // no fault asked for
  REQUIRE(train::world_options_for(options, 3).fail_on_send.empty());
}

TEST_CASE("run_beside runs both sides at once and rethrows the worker's failure first",
          "[train][launch]") {
  std::atomic<bool> worked{false};
  // The server waits for the worker: this finishes only if both run concurrently.
  train::run_beside(
      [&] {
        while (!worked.load())
          std::this_thread::yield();
      },
      [&] { worked = true; });
  REQUIRE(worked.load());
  REQUIRE_THROWS_WITH(train::run_beside([] { throw std::runtime_error("server broke"); },
                                        [] { throw std::runtime_error("worker broke"); }),
                      "worker broke");
  REQUIRE_THROWS_WITH(train::run_beside([] { throw std::runtime_error("server broke"); }, [] {}),
                      "server broke");
}

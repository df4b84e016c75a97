// What the trainer delegates: the checkpoint directory (staging, publishing, rotation, latest),
// evaluation scores, the in-process world's options, a co-located server's thread, and the
// servers it hosts (running ranks, routing checkpointed rows, traffic accounting).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>
#include <vector>

#include "strata/data/metrics.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/optim/sgd.hpp"
#include "strata/train/checkpoint_dir.hpp"
#include "strata/train/evaluation.hpp"
#include "strata/train/launch.hpp"
#include "strata/train/servers.hpp"
#include "support/ctr_fixtures.hpp"
#include "support/ensure.hpp"

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
  REQUIRE_THROWS_WITH(ckpt.latest(),
                      Catch::Contains("names step-30, which does not exist") &&
                          Catch::Contains("its newest checkpoint is") &&
                          Catch::Contains("--resume-from " + (dir / "step-20").string()));
  std::ofstream(dir / "latest", std::ios::trunc).flush();  // an empty `latest`
  REQUIRE_THROWS_WITH(ckpt.latest(),
                      Catch::Contains("'latest' is empty") && Catch::Contains("--resume-from"));
  fs::remove(dir / "latest");
  REQUIRE_THROWS_WITH(ckpt.latest(),
                      Catch::Contains("has no 'latest' file") && Catch::Contains("step-20"));
  REQUIRE_THROWS_AS(train::checkpoint_directory(""), strata::error);
  fs::remove_all(dir);
}

TEST_CASE("a fresh run refuses a directory holding another run's checkpoints",
          "[train][checkpoint]") {
  const fs::path dir = strata_test::fresh_dir("checkpoint_fresh");
  const train::checkpoint_directory ckpt(dir);
  REQUIRE_NOTHROW(ckpt.expect_fresh());  // not even created yet
  fs::create_directories(dir);
  REQUIRE_NOTHROW(ckpt.expect_fresh());
  ckpt.prepare(10);
  REQUIRE_NOTHROW(ckpt.expect_fresh());  // a staged, unpublished checkpoint is no checkpoint
  std::ofstream(ckpt.staging(10) / "state.ckpt") << 10;
  ckpt.publish(10);
  REQUIRE_THROWS_WITH(ckpt.expect_fresh(),
                      Catch::Contains("already holds checkpoints of an earlier run (newest "
                                      "step-10)") &&
                          Catch::Contains("continue that run with --resume"));
  // Resuming from one of its own checkpoints continues its lineage; from elsewhere it does not.
  REQUIRE_NOTHROW(ckpt.expect_fresh(dir / "step-10"));
  REQUIRE_THROWS_AS(ckpt.expect_fresh(strata_test::fresh_dir("elsewhere") / "step-10"),
                    strata::error);
  fs::remove_all(dir / "step-10");
  REQUIRE_THROWS_WITH(ckpt.expect_fresh(), Catch::Contains("already holds checkpoints"));  // latest
  fs::remove_all(dir);
}

TEST_CASE("checkpoint_lock: one job per directory, stale locks reported", "[train][checkpoint]") {
  const fs::path dir = strata_test::fresh_dir("checkpoint_lock");
  {
    const train::checkpoint_lock first(dir);  // creates the directory
    REQUIRE(fs::is_directory(dir));
    REQUIRE(first.stale_holder().empty());
    // A second claim (another open file description: as another job would) is refused,
    // naming the holder.
    REQUIRE_THROWS_WITH(
        train::checkpoint_lock(dir),
        Catch::Contains("is in use by another job (pid " + std::to_string(::getpid())) &&
            Catch::Contains("choose another directory"));
  }
  {
    const train::checkpoint_lock again(dir);  // released cleanly: nothing stale
    REQUIRE(again.stale_holder().empty());
  }
  // A job killed while holding the lock leaves its record; the kernel released the flock.
  std::ofstream(dir / "lock", std::ios::trunc) << "pid 99999 on elsewhere since yesterday\n";
  const train::checkpoint_lock after_crash(dir);
  REQUIRE(after_crash.stale_holder() == "pid 99999 on elsewhere since yesterday");
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
  REQUIRE_FALSE(train::world_options_for(options, 3).checksums);
  // A fault plan travels to the world with the classifier that tells pulls from pushes.
  options.faults = {
      {.rank = 1, .kind = comm::fault_kind::drop, .when = comm::phase::push, .nth = 3}};
  const auto planned = train::world_options_for(options, 3);
  REQUIRE(planned.faults.size() == 1);
  REQUIRE(planned.faults[0].when == comm::phase::push);
  REQUIRE(planned.classify != nullptr);
  options.faults[0].rank = 3;
  REQUIRE_THROWS_WITH(train::world_options_for(options, 3),
                      Catch::Contains("rank 3 is outside the world of 3 ranks"));
  options.faults.clear();
  options.message_checksums = true;
  REQUIRE(train::world_options_for(options, 3).checksums);
  // ps::message_phase: a request by its type, other tags by the tag.
  std::vector<std::byte> message;
  ps::header h;
  h.type = ps::msg_type::push_request;
  (void)ps::start_message(message, h);
  REQUIRE(ps::message_phase(comm::tags::ps_request, message) == comm::phase::push);
  h.type = ps::msg_type::pull_request;
  (void)ps::start_message(message, h);
  REQUIRE(ps::message_phase(comm::tags::ps_request, message) == comm::phase::pull);
  h.type = ps::msg_type::shutdown;
  (void)ps::start_message(message, h);
  REQUIRE(ps::message_phase(comm::tags::ps_request, message) == comm::phase::shutdown);
  REQUIRE(ps::message_phase(comm::tags::ps_request, {}) == comm::phase::request);
  REQUIRE(ps::message_phase(comm::tags::checkpoint, message) == comm::phase::checkpoint);
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

TEST_CASE("hosted_servers run dedicated and co-located server ranks and route rows to owners",
          "[train][servers]") {
  using server_type = ps::server<optim::sgd, ps::sync>;
  const std::vector<embedding::table_spec> specs{{"t", 100, 4}};
  const std::vector<float> row{1, 2, 3, 4};
  for (const bool colocated : {false, true}) {
    INFO((colocated ? "co-located" : "dedicated"));
    const auto roles = colocated ? ps::layout::colocated(2) : ps::layout::dedicated(2, 1);
    const ps::shard_map map(roles, specs);
    train::hosted_servers<server_type> servers(
        map, [](int) { return true; }, ps::rule_of<ps::sync>, optim::sgd{}, optim::sgd{},
        server_type::no_dense_table, ps::server_options{});
    REQUIRE((servers.at_rank(0) != nullptr) == colocated);
    // Each key goes to the one server that owns it, whichever rank loads it.
    int imported = 0;
    for (int rank = 0; rank < roles.ranks(); ++rank)
      imported += servers.import_owned(rank, 0, 42, row, {}) ? 1 : 0;
    REQUIRE(imported == 1);
    servers.import_anywhere(0, 7, row, {});
    std::vector<std::uint64_t> seen;
    servers.for_each_row(
        [&](std::size_t, std::uint64_t key, std::span<const float> values, std::span<const float>) {
          seen.push_back(key);
          REQUIRE(std::vector<float>(values.begin(), values.end()) == row);
        });
    std::sort(seen.begin(), seen.end());
    REQUIRE(seen == std::vector<std::uint64_t>{7, 42});

    comm::thread_world world(roles.ranks(), {.timeout_seconds = 20});
    std::atomic<int> workers_ran{0};
    REQUIRE_NOTHROW(world.run([&](comm::thread_transport& t) {
      servers.run(t, [&] {
        ++workers_ran;
        embedding::sharded<optim::sgd> client(t, map);
        const std::vector<std::uint64_t> keys{42, 7};
        matrix<float> got(2, 4);
        client.gather(0, keys, got.view());
        for (std::size_t c = 0; c < 4; ++c)
          strata_test::ensure(got(0, c) == row[c] && got(1, c) == row[c], "pulled row differs");
        client.shutdown();
      });
    }));
    REQUIRE(workers_ran.load() == 2);
    const auto stats = servers.stats();
    REQUIRE(stats.size() == (colocated ? 2u : 1u));
    train::train_report report;
    train::split_traffic(world, stats, report);
    std::uint64_t received = 0, sent = 0;
    for (const auto& st : stats) {
      received += st.bytes_received;
      sent += st.bytes_sent;
    }
    REQUIRE(received > 0);
    REQUIRE(report.bytes_worker_to_server == received);
    REQUIRE(report.bytes_server_to_worker == sent);
  }
}

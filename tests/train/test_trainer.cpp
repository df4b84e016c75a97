#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "strata/compress/error_feedback.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/sgd.hpp"
#include "strata/train/checkpoint_dir.hpp"
#include "strata/train/trainer.hpp"
#include "support/ctr_fixtures.hpp"

using namespace strata;
using strata_test::base_options;
using strata_test::fresh_dir;
using strata_test::make_data;
using strata_test::small_dlrm;

namespace {

template <class Opt>
using allreduce_trainer = train::trainer<models::dlrm, embedding::local<Opt>, comm::ring_allreduce>;
template <class Opt>
using hybrid_trainer =
    train::trainer<models::dlrm, embedding::sharded<Opt>, train::hybrid<ps::sync>>;
template <class Opt>
using ps_trainer =
    train::trainer<models::dlrm, embedding::sharded<Opt>, train::parameter_server<ps::sync>>;
template <class Opt>
using async_ps_trainer = train::trainer<models::dlrm, embedding::sharded<Opt, ps::async>,
                                        train::parameter_server<ps::async>>;

double max_relative(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / (std::abs(double(b[i])) + 1e-3));
  return worst;
}

}  // namespace

TEMPLATE_TEST_CASE("sync strategies train bitwise-identical models", "[train][equivalence]",
                   optim::sgd, optim::adagrad) {
  const auto data = make_data(2000, 1);
  TestType opt;
  opt.lr = 0.05f;
  for (int workers : {1, 2, 3}) {
    INFO("workers " << workers);
    auto options = base_options(workers, 24 / workers);
    allreduce_trainer<TestType> a(small_dlrm(), opt, options);
    const auto ra = a.fit(data);
    hybrid_trainer<TestType> h(small_dlrm(), opt, options);
    const auto rh = h.fit(data);
    options.servers = 0;  // co-located shards
    ps_trainer<TestType> p(small_dlrm(), opt, options);
    const auto rp = p.fit(data);
    REQUIRE(ra.steps == 12);
    CHECK(ra.dense_checksum == rh.dense_checksum);
    CHECK(ra.dense_checksum == rp.dense_checksum);
    CHECK(ra.embedding_checksum == rh.embedding_checksum);
    CHECK(ra.embedding_checksum == rp.embedding_checksum);
    CHECK(a.dense_parameters() == p.dense_parameters());
  }
}

TEST_CASE("N workers reproduce single-worker training on the global batch",
          "[train][equivalence]") {
  const auto data = make_data(2000, 2);
  optim::adagrad opt;
  opt.lr = 0.05f;
  allreduce_trainer<optim::adagrad> single(small_dlrm(), opt, base_options(1, 24));
  single.fit(data);
  for (int workers : {2, 4}) {
    hybrid_trainer<optim::adagrad> many(small_dlrm(), opt, base_options(workers, 24 / workers));
    many.fit(data);
    CHECK(max_relative(many.dense_parameters(), single.dense_parameters()) < 1e-5);
  }
}

TEST_CASE("evaluating between segments under a PS strategy changes nothing", "[train][eval]") {
  // Worker 0 evaluates at the end of each segment while the others already start the next:
  // every server must have restarted its step count before their first pull.
  const auto data = make_data(2000, 3);
  const auto held_out = make_data(300, 4);
  optim::adagrad opt;
  opt.lr = 0.05f;
  for (int servers : {2, 0}) {
    INFO("servers " << servers);
    auto options = base_options(3, 8);
    options.servers = servers;
    hybrid_trainer<optim::adagrad> plain(small_dlrm(), opt, options);
    const auto once = plain.fit(data, &held_out);
    options.eval_every = 3;
    hybrid_trainer<optim::adagrad> evaluating(small_dlrm(), opt, options);
    const auto often = evaluating.fit(data, &held_out);
    REQUIRE(often.evals.size() == 4);
    CHECK(often.evals.back().auc == once.evals.back().auc);
    CHECK(often.dense_checksum == once.dense_checksum);
    CHECK(often.embedding_checksum == once.embedding_checksum);
  }
}

TEST_CASE("resuming from a checkpoint equals never stopping, bitwise", "[train][checkpoint]") {
  const auto data = make_data(2000, 3);
  optim::adagrad opt;
  opt.lr = 0.05f;
  using compressed =
      train::trainer<models::dlrm, embedding::sharded<optim::adagrad>, train::hybrid<ps::sync>,
                     compress::error_feedback<compress::int8_block<256>>>;
  auto options = base_options(2, 12);
  compressed straight(small_dlrm(), opt, options);  // never stops, no checkpoints
  const auto full = straight.fit(data);
  REQUIRE(full.steps == 12);

  options.checkpoint_dir = fresh_dir("resume-b");
  options.checkpoint_every = 5;
  options.max_steps = 5;
  compressed first(small_dlrm(), opt, options);
  first.fit(data);
  options.max_steps = 12;
  options.resume = true;
  compressed second(small_dlrm(), opt, options);
  const auto resumed = second.fit(data);
  CHECK(resumed.first_step == 5);
  CHECK(resumed.steps == 12);
  CHECK(resumed.dense_checksum == full.dense_checksum);
  CHECK(resumed.embedding_checksum == full.embedding_checksum);
}

TEST_CASE("checkpoint ownership: fresh runs, a damaged latest, another seed, a second job",
          "[train][checkpoint]") {
  const auto data = make_data(2000, 3);
  optim::adagrad opt;
  opt.lr = 0.05f;
  auto options = base_options(2, 12);
  hybrid_trainer<optim::adagrad> straight(small_dlrm(), opt, options);
  const auto full = straight.fit(data);

  options.checkpoint_dir = fresh_dir("ownership");
  options.checkpoint_every = 2;
  options.max_steps = 6;
  hybrid_trainer<optim::adagrad>(small_dlrm(), opt, options).fit(data);  // steps 4 and 6 kept
  // A fresh run into the used directory is refused before anything is written.
  const auto before = std::filesystem::last_write_time(options.checkpoint_dir / "latest");
  REQUIRE_THROWS_WITH(hybrid_trainer<optim::adagrad>(small_dlrm(), opt, options).fit(data),
                      Catch::Contains("already holds checkpoints of an earlier run (newest "
                                      "step-6)"));
  CHECK(std::filesystem::last_write_time(options.checkpoint_dir / "latest") == before);
  CHECK(train::checkpoint_directory(options.checkpoint_dir).steps() ==
        std::vector<std::size_t>{4, 6});
  // Another seed (which also keys the data's hashing and order) is refused on resume.
  auto other_seed = options;
  other_seed.resume = true;
  other_seed.seed = options.seed + 1;
  REQUIRE_THROWS_WITH(hybrid_trainer<optim::adagrad>(small_dlrm(), opt, other_seed).fit(data),
                      Catch::Contains("written by a run with seed"));
  // A damaged `latest` names the newest checkpoint; --resume-from it gives the never-stopped
  // model, bitwise, while new checkpoints go into the same directory.
  std::ofstream(options.checkpoint_dir / "latest", std::ios::trunc).flush();
  auto resume = options;
  resume.resume = true;
  resume.max_steps = 12;
  REQUIRE_THROWS_WITH(
      hybrid_trainer<optim::adagrad>(small_dlrm(), opt, resume).fit(data),
      Catch::Contains("'latest' is empty") &&
          Catch::Contains("--resume-from " + (options.checkpoint_dir / "step-6").string()));
  auto from = options;
  from.resume_from = options.checkpoint_dir / "step-6";
  from.max_steps = 12;
  hybrid_trainer<optim::adagrad> continued(small_dlrm(), opt, from);
  const auto resumed = continued.fit(data);
  CHECK(resumed.first_step == 6);
  CHECK(resumed.dense_checksum == full.dense_checksum);
  CHECK(resumed.embedding_checksum == full.embedding_checksum);
  CHECK(train::checkpoint_directory(options.checkpoint_dir).latest() ==
        options.checkpoint_dir / "step-12");
  // A second job on a directory another job holds is refused at once.
  {
    const train::checkpoint_lock other_job(options.checkpoint_dir);
    resume.max_steps = 14;
    REQUIRE_THROWS_WITH(hybrid_trainer<optim::adagrad>(small_dlrm(), opt, resume).fit(data),
                        Catch::Contains("is in use by another job"));
  }
  CHECK(hybrid_trainer<optim::adagrad>(small_dlrm(), opt, resume).fit(data).first_step == 12);
}

TEST_CASE("a checkpoint with a missing or an unlisted file is refused, naming it",
          "[train][checkpoint]") {
  const auto data = make_data(2000, 3);
  optim::adagrad opt;
  using compressed =
      train::trainer<models::dlrm, embedding::sharded<optim::adagrad>, train::hybrid<ps::sync>,
                     compress::error_feedback<compress::int8_block<256>>>;
  auto options = base_options(2, 12);
  options.checkpoint_dir = fresh_dir("incomplete");
  options.max_steps = 4;
  compressed(small_dlrm(), opt, options).fit(data);
  const auto step = options.checkpoint_dir / "step-4";
  for (const char* file : {"state.ckpt", "rows-worker-0.ckpt", "rows-server-0.ckpt",
                           "rows-server-1.ckpt", "worker-0.ckpt", "worker-1.ckpt"})
    REQUIRE(std::filesystem::exists(step / file));
  auto resume = options;
  resume.resume = true;
  resume.max_steps = 6;
  const auto keep = fresh_dir("incomplete-copy");
  std::filesystem::copy(step, keep);
  for (const char* missing : {"rows-server-1.ckpt", "worker-1.ckpt", "rows-worker-0.ckpt"}) {
    INFO(missing);
    std::filesystem::remove(step / missing);
    REQUIRE_THROWS_WITH(compressed(small_dlrm(), opt, resume).fit(data),
                        Catch::Contains("is incomplete") && Catch::Contains(missing));
    std::filesystem::copy_file(keep / missing, step / missing);
  }
  std::filesystem::copy_file(keep / "rows-server-1.ckpt", step / "rows-server-7.ckpt");
  REQUIRE_THROWS_WITH(compressed(small_dlrm(), opt, resume).fit(data),
                      Catch::Contains("rows-server-7.ckpt") && Catch::Contains("does not list"));
  std::filesystem::remove(step / "rows-server-7.ckpt");
  CHECK(compressed(small_dlrm(), opt, resume).fit(data).first_step == 4);  // whole again
}

TEST_CASE("a checkpoint written under one strategy and world size loads under another",
          "[train][checkpoint]") {
  const auto data = make_data(2000, 4);
  optim::adagrad opt;
  opt.lr = 0.05f;
  auto options = base_options(2, 12);
  options.checkpoint_dir = fresh_dir("cross");
  allreduce_trainer<optim::adagrad> writer(small_dlrm(), opt, options);
  const auto written = writer.fit(data);

  // Load into a parameter server run with 3 workers and 2 dedicated servers: the state after
  // loading (no further steps) is the same model.
  auto ps_options = base_options(3, 8);
  ps_options.checkpoint_dir = options.checkpoint_dir;
  ps_options.resume = true;
  ps_trainer<optim::adagrad> reader(small_dlrm(), opt, ps_options);
  const auto loaded = reader.fit(data);
  CHECK(loaded.first_step == 12);
  CHECK(loaded.dense_checksum == written.dense_checksum);
  CHECK(loaded.embedding_checksum == written.embedding_checksum);

  // ... and both continue training identically from there (same W for the comparison).
  auto more = base_options(2, 12);
  more.checkpoint_dir = options.checkpoint_dir;
  more.resume = true;
  more.max_steps = 20;
  allreduce_trainer<optim::adagrad> a(small_dlrm(), opt, more);
  hybrid_trainer<optim::adagrad> h(small_dlrm(), opt, more);
  const auto ra = a.fit(data);
  const auto rh = h.fit(data);
  CHECK(ra.dense_checksum == rh.dense_checksum);
  CHECK(ra.embedding_checksum == rh.embedding_checksum);
}

TEST_CASE("corrupted or truncated checkpoints are refused, the previous one stays",
          "[train][checkpoint]") {
  const auto data = make_data(2000, 5);
  optim::sgd opt;
  opt.lr = 0.05f;
  auto options = base_options(1, 16);
  options.checkpoint_dir = fresh_dir("corrupt");
  options.checkpoint_every = 4;
  options.max_steps = 8;
  allreduce_trainer<optim::sgd> t(small_dlrm(), opt, options);
  t.fit(data);
  const auto dir = options.checkpoint_dir;
  REQUIRE(std::filesystem::exists(dir / "step-4" / "state.ckpt"));
  REQUIRE(std::filesystem::exists(dir / "step-8" / "rows-worker-0.ckpt"));

  const auto damage = [](const std::filesystem::path& file, bool truncate) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    if (truncate) {
      std::filesystem::resize_file(file, std::filesystem::file_size(file) / 2);
    } else {
      f.seekp(40);
      f.put('\x7f');
    }
  };
  auto resume = options;
  resume.resume = true;
  resume.max_steps = 10;
  damage(dir / "step-8" / "rows-worker-0.ckpt", false);
  REQUIRE_THROWS_WITH(allreduce_trainer<optim::sgd>(small_dlrm(), opt, resume).fit(data),
                      Catch::Contains("checksum mismatch") && Catch::Contains("step-8"));
  damage(dir / "step-8" / "state.ckpt", true);
  REQUIRE_THROWS_WITH(allreduce_trainer<optim::sgd>(small_dlrm(), opt, resume).fit(data),
                      Catch::Contains("truncated"));
  // The previous checkpoint is intact and loads.
  resume.checkpoint_dir = dir / "step-4";
  allreduce_trainer<optim::sgd> from_previous(small_dlrm(), opt, resume);
  CHECK(from_previous.fit(data).first_step == 4);

  // A checkpoint of another model configuration is refused with a reason.
  auto other = small_dlrm();
  other.top_mlp = {16, 1};
  REQUIRE_THROWS_WITH(allreduce_trainer<optim::sgd>(other, opt, resume).fit(data),
                      Catch::Contains("dense parameters"));
}

TEST_CASE("async and bounded PS training still learn", "[train][consistency]") {
  const auto data = make_data(4000, 6);
  optim::adagrad opt;
  opt.lr = 0.05f;
  auto options = base_options(3, 16);
  options.max_steps = 0;
  options.epochs = 3;
  const auto eval = make_data(1000, 60);
  using async_t = async_ps_trainer<optim::adagrad>;
  using bounded_t = train::trainer<models::dlrm, embedding::sharded<optim::adagrad, ps::bounded<2>>,
                                   train::hybrid<ps::bounded<2>>, compress::fp16>;
  const auto ra = async_t(small_dlrm(), opt, options).fit(data, &eval);
  const auto rb = bounded_t(small_dlrm(), opt, options).fit(data, &eval);
  const auto rs = hybrid_trainer<optim::adagrad>(small_dlrm(), opt, options).fit(data, &eval);
  REQUIRE(!ra.evals.empty());
  // Async and bounded results depend on thread timing (that is their point), so they are held
  // to an absolute bar well above chance (0.5) rather than to the sync run's exact AUC.
  CHECK(rs.evals.back().auc > 0.7);
  CHECK(ra.evals.back().auc > 0.62);
  CHECK(rb.evals.back().auc > 0.62);
  for (const auto& s : rb.server_stats)
    CHECK(s.max_staleness <= 2);
}

TEST_CASE("async PS prefetches the next step's rows: deterministic at one worker, one step stale",
          "[train][consistency][prefetch]") {
  const auto data = make_data(3000, 16);
  const auto eval = make_data(1000, 61);
  optim::adagrad opt;
  opt.lr = 0.05f;
  auto options = base_options(1, 32);
  options.servers = 1;
  options.max_steps = 0;
  options.epochs = 2;
  using async_t = async_ps_trainer<optim::adagrad>;
  async_t prefetching(small_dlrm(), opt, options);
  REQUIRE(prefetching.prefetches());
  REQUIRE(!ps_trainer<optim::adagrad>(small_dlrm(), opt, options).prefetches());
  REQUIRE(!allreduce_trainer<optim::adagrad>(small_dlrm(), opt, options).prefetches());
  const auto first = prefetching.fit(data, &eval);
  const auto second = async_t(small_dlrm(), opt, options).fit(data, &eval);
  const auto sync = ps_trainer<optim::adagrad>(small_dlrm(), opt, options).fit(data, &eval);
  // One worker: the pull of step s + 1 always reaches the server before the push of step s
  // (one FIFO per worker), so the run is deterministic...
  REQUIRE(first.dense_checksum == second.dense_checksum);
  REQUIRE(first.embedding_checksum == second.embedding_checksum);
  // ...and differs from sync, whose step s + 1 sees step s's update: the pull did overlap.
  REQUIRE(first.dense_checksum != sync.dense_checksum);
  // One step of staleness costs little.
  INFO("async prefetch AUC " << first.evals.back().auc << ", sync " << sync.evals.back().auc);
  CHECK(first.evals.back().auc > sync.evals.back().auc - 0.02);
}

TEST_CASE("a consistency chosen at run time trains bitwise the typed policy's model",
          "[train][consistency]") {
  const auto data = make_data(1500, 17);
  optim::adagrad opt;
  opt.lr = 0.05f;
  using chosen_tables = embedding::sharded<optim::adagrad, ps::run_time_rule>;
  using chosen_ps =
      train::trainer<models::dlrm, chosen_tables, train::parameter_server<ps::run_time_rule>>;
  using chosen_hybrid =
      train::trainer<models::dlrm, chosen_tables, train::hybrid<ps::run_time_rule>, compress::fp16>;
  const auto same = [](const train::train_report& a, const train::train_report& b) {
    REQUIRE(a.steps == b.steps);
    CHECK(a.dense_checksum == b.dense_checksum);
    CHECK(a.embedding_checksum == b.embedding_checksum);
  };
  SECTION("sync: 3 workers, 2 servers") {
    const auto options = base_options(3, 8);
    chosen_ps chosen(small_dlrm(), opt, options, -1, {.rule = ps::rule_of<ps::sync>});
    CHECK(!chosen.prefetches());
    same(chosen.fit(data), ps_trainer<optim::adagrad>(small_dlrm(), opt, options).fit(data));
  }
  SECTION("async: one worker prefetches as the typed policy does (deterministic there)") {
    auto options = base_options(1, 24);
    options.servers = 1;
    chosen_ps chosen(small_dlrm(), opt, options, -1, {.rule = ps::rule_of<ps::async>});
    CHECK(chosen.prefetches());
    const auto typed = async_ps_trainer<optim::adagrad>(small_dlrm(), opt, options).fit(data);
    same(chosen.fit(data), typed);
    // ...and differs from sync (the prefetched rows miss the step's own push).
    CHECK(typed.dense_checksum !=
          ps_trainer<optim::adagrad>(small_dlrm(), opt, options).fit(data).dense_checksum);
  }
  SECTION("bounded<2> under hybrid with fp16 pushes: one worker") {
    auto options = base_options(1, 24);
    using typed_t = train::trainer<models::dlrm, embedding::sharded<optim::adagrad, ps::bounded<2>>,
                                   train::hybrid<ps::bounded<2>>, compress::fp16>;
    chosen_hybrid chosen(small_dlrm(), opt, options, -1, {.rule = ps::bounded_rule(2)});
    CHECK(!chosen.prefetches());
    const auto r = chosen.fit(data);
    same(r, typed_t(small_dlrm(), opt, options).fit(data));
    for (const auto& s : r.server_stats)
      CHECK(s.max_staleness <= 2);
  }
  SECTION("a rule no policy has is refused when the trainer is built") {
    REQUIRE_THROWS_WITH(
        chosen_ps(small_dlrm(), opt, base_options(2, 8), -1, {.rule = {"odd", 1, true, false, 0}}),
        Catch::Contains("trainer: consistency rule 'odd'") && Catch::Contains("does not block"));
  }
}

TEST_CASE("auto_strategy picks each branch from the model's sizes", "[train][strategy]") {
  using namespace train;
  STATIC_REQUIRE(std::is_same_v<auto_strategy_t<900u << 20, 2u << 20>, parameter_server<ps::sync>>);
  STATIC_REQUIRE(std::is_same_v<auto_strategy_t<1u << 20, 200u << 20>, comm::ring_allreduce>);
  STATIC_REQUIRE(std::is_same_v<auto_strategy_t<500u << 20, 500u << 20>, hybrid<ps::sync>>);
  // Large embeddings but a large DNN too: hybrid.
  STATIC_REQUIRE(std::is_same_v<auto_strategy_t<4000u << 20, 400u << 20>, hybrid<ps::sync>>);
  CHECK(std::string(choose_strategy(900u << 20, 2u << 20)) == "ps");
}

TEST_CASE("in-process PS pulls train the same model as pull messages", "[train][in_process]") {
  const auto data = make_data(1500, 6);
  optim::adagrad opt;
  opt.lr = 0.05f;
  const auto run = [&]<class Trainer>(Trainer*, bool in_process) {
    auto options = base_options(2, 8);
    options.in_process_pulls = in_process;
    return Trainer(small_dlrm(), opt, options).fit(data);
  };
  const auto messages = run(static_cast<ps_trainer<optim::adagrad>*>(nullptr), false);
  const auto direct = run(static_cast<ps_trainer<optim::adagrad>*>(nullptr), true);
  CHECK(direct.dense_checksum == messages.dense_checksum);
  CHECK(direct.embedding_checksum == messages.embedding_checksum);
  // No pull replies cross the world: only the shutdown acknowledgements.
  CHECK(direct.bytes_server_to_worker < messages.bytes_server_to_worker / 100);
  const auto hybrid_messages = run(static_cast<hybrid_trainer<optim::adagrad>*>(nullptr), false);
  const auto hybrid_direct = run(static_cast<hybrid_trainer<optim::adagrad>*>(nullptr), true);
  CHECK(hybrid_direct.dense_checksum == hybrid_messages.dense_checksum);
  CHECK(hybrid_direct.embedding_checksum == hybrid_messages.embedding_checksum);
  CHECK(hybrid_direct.dense_checksum == direct.dense_checksum);  // sync strategies agree
  // One worker under async: in-process reads follow the worker's own pushes, as messages do.
  auto options = base_options(1, 8);
  options.in_process_pulls = false;
  const auto async_messages =
      async_ps_trainer<optim::adagrad>(small_dlrm(), opt, options).fit(data);
  options.in_process_pulls = true;
  const auto async_direct = async_ps_trainer<optim::adagrad>(small_dlrm(), opt, options).fit(data);
  CHECK(async_direct.dense_checksum == async_messages.dense_checksum);
  CHECK(async_direct.embedding_checksum == async_messages.embedding_checksum);
}

TEST_CASE("the Communicator's options reach its dense path", "[train][strategy]") {
  const auto data = make_data(1500, 5);
  optim::adagrad opt;
  opt.lr = 0.05f;
  auto options = base_options(3, 6);
  options.deterministic = false;  // strata's ring, chunk by chunk
  using ring_trainer = allreduce_trainer<optim::adagrad>;
  const auto plain = ring_trainer(small_dlrm(), opt, options).fit(data);
  // Each value's additions happen in its segment's order whatever the chunk: the same model.
  const auto chunked =
      ring_trainer(small_dlrm(), opt, options, -1, comm::ring_allreduce{.chunk_bytes = 64})
          .fit(data);
  CHECK(chunked.dense_checksum == plain.dense_checksum);
  CHECK(chunked.embedding_checksum == plain.embedding_checksum);
  REQUIRE_THROWS_WITH(
      ring_trainer(small_dlrm(), opt, options, -1, comm::ring_allreduce{.chunk_bytes = 2}),
      Catch::Contains("chunk_bytes is 2"));
  using hybrid_type = hybrid_trainer<optim::adagrad>;
  const auto hybrid_chunked =
      hybrid_type(small_dlrm(), opt, options, -1,
                  train::hybrid<ps::sync>{.dense_allreduce = {.chunk_bytes = 64}})
          .fit(data);
  CHECK(hybrid_chunked.dense_checksum == plain.dense_checksum);
  REQUIRE_THROWS_WITH(hybrid_type(small_dlrm(), opt, options, -1,
                                  train::hybrid<ps::sync>{.dense_allreduce = {.chunk_bytes = 3}}),
                      Catch::Contains("chunk_bytes is 3"));
}

TEST_CASE("a diverging run stops at the step, names the last good checkpoint, writes none",
          "[train][divergence]") {
  const auto data = make_data(2000, 8);
  optim::sgd good;
  good.lr = 0.05f;
  auto options = base_options(2, 12);
  options.checkpoint_dir = fresh_dir("diverge");
  options.checkpoint_every = 4;
  options.max_steps = 8;
  allreduce_trainer<optim::sgd>(small_dlrm(), good, options).fit(data);
  REQUIRE(std::filesystem::exists(options.checkpoint_dir / "step-8"));
  const auto unguarded_dir = fresh_dir("diverge-unguarded");
  std::filesystem::copy(options.checkpoint_dir, unguarded_dir,
                        std::filesystem::copy_options::recursive);

  // Resumed with an absurd learning rate, the weights overflow within a few steps.
  optim::sgd absurd;
  absurd.lr = 1e30f;
  auto resume = options;
  resume.resume = true;
  resume.max_steps = 20;
  resume.checkpoint_every = 2;
  const auto diverges = [&](auto&& trainer) {
    try {
      trainer.fit(data);
    } catch (const strata::error& e) {
      CHECK(e.code() == errc::diverged);
      const std::string what = e.what();
      UNSCOPED_INFO(what);
      CHECK(what.find("training diverged at step ") != std::string::npos);
      CHECK(what.find("on worker ") != std::string::npos);
      CHECK(what.find("--lr") != std::string::npos);
      return what;
    }
    FAIL("the diverging run finished");
    return std::string();
  };
  SECTION("allreduce") {
    const auto what = diverges(allreduce_trainer<optim::sgd>(small_dlrm(), absurd, resume));
    // A checkpoint written before the divergence (steps 10, 12, ...) is finite and named.
    CHECK(what.find("last good checkpoint is") != std::string::npos);
  }
  SECTION("parameter servers") {
    const auto what = diverges(ps_trainer<optim::sgd>(small_dlrm(), absurd, resume));
    CHECK(what.find("last good checkpoint is") != std::string::npos);
  }
  // Every checkpoint left in the directory holds finite values only: the newest loads and
  // trains on with the sane learning rate.
  auto again = options;
  again.resume = true;
  again.max_steps = 24;
  const auto report = allreduce_trainer<optim::sgd>(small_dlrm(), good, again).fit(data);
  CHECK(report.steps == 24);
  CHECK(std::isfinite(report.train_loss));

  // Without the guard the run goes on, but no checkpoint is written from non-finite values.
  auto unguarded = resume;
  unguarded.divergence_guard = false;
  unguarded.checkpoint_dir = unguarded_dir;
  unguarded.max_steps = 40;
  unguarded.checkpoint_every = 16;  // the first checkpoint after the resume: step 16
  REQUIRE_THROWS_WITH(
      allreduce_trainer<optim::sgd>(small_dlrm(), absurd, unguarded).fit(data),
      Catch::Contains("refusing to write checkpoint") && Catch::Contains("non-finite"));
  CHECK_FALSE(std::filesystem::exists(unguarded.checkpoint_dir / "step-16"));
}

TEST_CASE("bad trainer settings and data are reported", "[train]") {
  optim::sgd opt;
  auto options = base_options(0, 8);
  REQUIRE_THROWS_WITH(allreduce_trainer<optim::sgd>(small_dlrm(), opt, options),
                      Catch::Contains("workers must be"));
  options = base_options(2, 8);
  const auto small = make_data(10, 1);
  REQUIRE_THROWS_WITH(allreduce_trainer<optim::sgd>(small_dlrm(), opt, options).fit(small),
                      Catch::Contains("fewer than one global batch"));
  data::ctr_dataset wrong(5, 4);
  REQUIRE_THROWS_WITH(allreduce_trainer<optim::sgd>(small_dlrm(), opt, options).fit(wrong),
                      Catch::Contains("fewer than one global batch") || Catch::Contains("columns"));
  options.resume = true;
  options.checkpoint_dir = fresh_dir("nothing-here");
  REQUIRE_THROWS_WITH(
      allreduce_trainer<optim::sgd>(small_dlrm(), opt, options).fit(make_data(100, 1)),
      Catch::Contains("no checkpoint to resume from"));
  options = base_options(2, 8);
  options.blowup_warn_factor = 0.5;
  REQUIRE_THROWS_WITH(allreduce_trainer<optim::sgd>(small_dlrm(), opt, options),
                      Catch::Contains("blowup_warn_factor"));
}

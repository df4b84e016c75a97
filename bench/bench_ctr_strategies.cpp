/// @file bench_ctr_strategies.cpp
/// End-to-end CTR training throughput of each strategy (DLRM, synthetic Criteo-format data,
/// 4 workers as threads) and the share of worker 0's step time spent communicating (pull,
/// allreduce, push). Baseline, timed in the same run: the same global batch trained by one
/// worker (no communication at all); ratio = strategy samples/s / single-worker samples/s.
/// Verification first: the sync strategies must produce bit-identical models.
/// --checksums: every message carries thread_world's checksum (trainer_options::
/// message_checksums), to measure what they cost (docs/reliability.md).
// GCC 12 with -march=native warns falsely inside Eigen's AVX-512 intrinsics.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <cstdio>
#include <numeric>
#include <vector>

#include "bench_common.hpp"
#include "strata/compress/error_feedback.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"

using namespace strata;

namespace {

data::ctr_dataset make_data(std::size_t n, std::uint64_t rows) {
  data::ctr_dataset set;
  counter_rng rng{3, 1};
  std::vector<float> dense(13);
  std::vector<std::uint64_t> keys(26);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t d = 0; d < 13; ++d)
      dense[d] = rng.uniform(i * 64 + d, 0.0f, 3.0f);
    double logit = -1.0;
    for (std::size_t f = 0; f < 26; ++f) {
      keys[f] = rng.below(i * 64 + 16 + f, rows);
      logit += (keys[f] % 7 == 0) ? 0.6 : -0.05;
    }
    set.append(dense, keys,
               rng.uniform_double(i * 64 + 60) < 1 / (1 + std::exp(-logit)) ? 1.0f : 0.0f);
  }
  return set;
}

template <class Trainer, class Communicator = typename Trainer::communicator_type>
train::train_report run(const models::dlrm::config& model, const train::trainer_options& options,
                        const data::ctr_dataset& set, Communicator communicator = {}) {
  Trainer trainer(model, optim::adagrad{.lr = 0.02f}, options, -1, communicator);
  return trainer.fit(set);
}

double comm_share(const train::train_report& r) {
  const double total = std::accumulate(r.phase_seconds.begin(), r.phase_seconds.end(), 0.0);
  const double comm = r.phase_seconds[train::pull_phase] + r.phase_seconds[train::allreduce_phase] +
                      r.phase_seconds[train::push_phase];
  return total > 0 ? comm / total : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto opts = bench::options::parse(argc, argv, {"--checksums"});
    const std::uint64_t rows = 100'000;
    models::dlrm::config model;  // Kaggle layer sizes, smaller tables
    model.table_rows = {rows};
    train::trainer_options options;
    options.workers = 4;
    options.servers = 2;
    options.batch = 128;  // per worker: global batch 512
    options.max_steps = opts.quick ? 8 : 40;
    options.progress = false;
    options.message_checksums = std::find(opts.rest.begin(), opts.rest.end(),
                                          std::string("--checksums")) != opts.rest.end();
    const auto set = make_data(options.batch * 4 * options.max_steps, rows);

    // The compositions ctr_train runs: the PS consistency is a run-time rule there.
    using local = embedding::local<optim::adagrad>;
    using sharded = embedding::sharded<optim::adagrad, ps::run_time_rule>;
    using ps_strategy = train::parameter_server<ps::run_time_rule>;
    using hybrid_strategy = train::hybrid<ps::run_time_rule>;
    using dlrm = models::dlrm;
    const auto allreduce =
        run<train::trainer<dlrm, local, comm::ring_allreduce>>(model, options, set);
    const auto hybrid = run<train::trainer<dlrm, sharded, hybrid_strategy>>(model, options, set);
    const auto ps = run<train::trainer<dlrm, sharded, ps_strategy>>(model, options, set);
    const auto hybrid_int8 =
        run<train::trainer<dlrm, sharded, hybrid_strategy,
                           compress::error_feedback<compress::int8_block<256>>>>(model, options,
                                                                                 set);
    const auto async_ps = run<train::trainer<dlrm, sharded, ps_strategy>>(
        model, options, set, ps_strategy{.rule = ps::rule_of<ps::async>});
    if (allreduce.dense_checksum != hybrid.dense_checksum ||
        allreduce.dense_checksum != ps.dense_checksum ||
        allreduce.embedding_checksum != ps.embedding_checksum)
      fail(errc::internal,
           "bench_ctr_strategies: sync strategies disagree; results not comparable");

    // Baseline: one worker, the same global batch, no communication.
    auto single_options = options;
    single_options.workers = 1;
    single_options.batch = options.batch * 4;
    const auto single =
        run<train::trainer<dlrm, local, comm::ring_allreduce>>(model, single_options, set);

    std::vector<bench::result> results;
    const auto add = [&](const char* name, const train::train_report& r) {
      results.push_back({std::string("ctr_") + name + "_samples_per_s", r.samples_per_second,
                         "samples/s", single.samples_per_second,
                         r.samples_per_second / single.samples_per_second});
      results.push_back({std::string("ctr_") + name + "_comm_share", comm_share(r), "fraction", 1.0,
                         comm_share(r)});
    };
    add("allreduce", allreduce);
    add("hybrid", hybrid);
    add("ps", ps);
    add("hybrid_int8", hybrid_int8);
    add("ps_async", async_ps);
    bench::report(opts, results);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ctr_strategies: %s\n", e.what());
    return 1;
  }
}

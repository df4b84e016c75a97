/// @file bench_ps.cpp
/// Parameter-server pull and push throughput (rows/s) through a thread_world, against a
/// local-table gather / apply of the same keys timed in the same run.
///
/// Rows/s = workers × rounds × batch / seconds (rows as requested by the batch, duplicates
/// included). Keys are Zipf(1.05) over a 100 000-row table, so de-duplication matters.
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "strata/comm/collectives.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/core/rng.hpp"
#include "strata/embedding/local.hpp"
#include "strata/optim/sgd.hpp"
#include "strata/ps.hpp"

using namespace strata;

namespace {

constexpr std::uint64_t vocab = 100'000;
constexpr std::size_t batch = 4096;

/// Zipf(s) keys by inverse CDF; key 0 is the hottest.
std::vector<std::uint64_t> zipf_keys(std::size_t n, std::uint64_t seed) {
  static const std::vector<double> cdf = [] {
    std::vector<double> c(vocab);
    double sum = 0;
    for (std::uint64_t k = 0; k < vocab; ++k)
      c[k] = (sum += 1.0 / std::pow(static_cast<double>(k + 1), 1.05));
    for (auto& v : c)
      v /= sum;
    return c;
  }();
  const counter_rng rng{seed, 17};
  std::vector<std::uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i)
    keys[i] = static_cast<std::uint64_t>(
        std::lower_bound(cdf.begin(), cdf.end(), rng.uniform_double(i)) - cdf.begin());
  return keys;
}

struct config {
  int workers, servers, threads;
  std::size_t dim;
};

/// Times `rounds` pulls then `rounds` pushes per worker; returns {pull rows/s, push rows/s}.
std::pair<double, double> run_ps(const config& cfg, int rounds,
                                 const std::vector<std::vector<std::uint64_t>>& keys) {
  const ps::shard_map map(ps::layout::dedicated(cfg.workers, cfg.servers), {{"t", vocab, cfg.dim}});
  comm::thread_world world(cfg.workers + cfg.servers, {.timeout_seconds = 120});
  std::vector<double> pull_s(static_cast<std::size_t>(cfg.workers)),
      push_s(static_cast<std::size_t>(cfg.workers));
  const embedding::uniform_init init{};
  // No worker pushes before every worker has verified its first pull (async: a push is applied
  // on arrival, so another worker's early push would change the rows being checked).
  std::barrier verified(cfg.workers);
  world.run([&](comm::thread_transport& t) {
    if (map.roles().is_server(t.rank())) {
      ps::server<optim::sgd, ps::async> server(map, map.roles().server_index(t.rank()), {},
                                               {.threads = cfg.threads});
      server.serve(t);
      return;
    }
    const auto w = static_cast<std::size_t>(t.rank());
    ps::client<ps::async> c(t, map);
    matrix<float> rows(batch, cfg.dim);
    // Verify before timing: every pulled row is the table's initial row.
    std::uint64_t wrong = vocab;  // a key whose pulled row is wrong (vocab: none)
    std::exception_ptr failed;
    try {
      c.pull(0, keys[w], rows);
      for (std::size_t i = 0; i < batch && wrong == vocab; i += 97)
        for (std::size_t j = 0; j < cfg.dim; ++j)
          if (rows(i, j) != init.value(0, keys[w][i], j, cfg.dim)) wrong = keys[w][i];
    } catch (...) {
      failed = std::current_exception();
    }
    verified.arrive_and_wait();  // before failing, so no other worker waits for this one
    if (failed) std::rethrow_exception(failed);
    if (wrong != vocab)
      fail(errc::internal, cat("bench_ps: pulled row of key ", wrong, " is wrong"));
    stopwatch watch;
    for (int r = 0; r < rounds; ++r)
      c.pull(0, keys[w], rows);
    pull_s[w] = watch.lap();
    for (int r = 0; r < rounds; ++r)
      c.push(0, keys[w], rows);
    c.shutdown();  // waits until the servers applied every push
    push_s[w] = watch.lap();
  });
  const double rows_total = static_cast<double>(cfg.workers) * rounds * batch;
  return {rows_total / *std::max_element(pull_s.begin(), pull_s.end()),
          rows_total / *std::max_element(push_s.begin(), push_s.end())};
}

/// Local baseline: one thread gathers / applies the same keys from a dense table.
std::pair<double, double> run_local(std::size_t dim, int rounds,
                                    const std::vector<std::uint64_t>& keys) {
  embedding::local<optim::sgd> table({{"t", vocab, dim}});
  matrix<float> rows(batch, dim);
  const double gather = bench::best_seconds(
      [&] {
        for (int r = 0; r < rounds; ++r)
          table.gather(0, keys, rows);
      },
      3);
  const double apply = bench::best_seconds(
      [&] {
        for (int r = 0; r < rounds; ++r)
          table.apply_gradients(0, keys, rows);
      },
      3);
  const double n = static_cast<double>(rounds) * batch;
  return {n / gather, n / apply};
}

/// The trainer's PS step (ctr_train --strategy ps): one rank that trains and serves (co-located,
/// sync), `tables` tables of `dim`, a batch of `step_batch` keys per table; one round = pull
/// every table, then push a gradient for every table. `batched` uses the multi-table calls
/// (one pipelined request per table and server before any reply is awaited), otherwise one
/// pull / push per table; `in_process` (with `batched`) reads the server's rows directly
/// (client_options::in_process_servers, what the trainer does in one process). Returns
/// {pull rounds/s, step (pull + push) rounds/s}.
constexpr std::size_t step_tables = 26, step_batch = 128;

std::pair<double, double> run_step(std::size_t dim, int rounds, bool batched, bool in_process,
                                   const std::vector<std::vector<std::uint64_t>>& keys) {
  std::vector<embedding::table_spec> specs;
  for (std::size_t t = 0; t < step_tables; ++t)
    specs.push_back({cat("t", t), vocab, dim});
  const ps::shard_map map(ps::layout::colocated(1), specs);
  comm::thread_world world(1, {.timeout_seconds = 120});
  double pull_seconds = 0, step_seconds = 0;
  world.run([&](comm::thread_transport& t) {
    ps::server<optim::sgd, ps::sync> server(map, 0);
    std::exception_ptr server_error;
    std::thread serving([&] {
      try {
        server.serve(t);
      } catch (...) {
        server_error = std::current_exception();
      }
    });
    {
      ps::client_options copts;
      if (in_process)
        copts.in_process_servers.emplace_back(
            [&server](int worker, std::size_t table, std::uint64_t step,
                      std::span<const std::uint64_t> k,
                      const std::function<void(std::size_t, const float*)>& sink) {
              server.read_rows(worker, table, step, k, 120.0, sink);
            });
      ps::client<ps::sync> c(t, map, copts);
      std::vector<matrix<float>> rows;
      for (std::size_t i = 0; i < step_tables; ++i)
        rows.emplace_back(step_batch, dim);
      std::vector<ps::table_pull> pulls;
      std::vector<ps::table_push> pushes;
      for (std::size_t i = 0; i < step_tables; ++i) {
        pulls.push_back({i, keys[i], rows[i]});
        pushes.push_back({i, keys[i], rows[i]});
      }
      const auto pull = [&] {
        if (batched) {
          c.pull_tables(pulls);
        } else {
          for (std::size_t i = 0; i < step_tables; ++i)
            c.pull(i, keys[i], rows[i]);
        }
      };
      const auto push = [&] {
        if (batched) {
          c.push_tables(pushes);
        } else {
          for (std::size_t i = 0; i < step_tables; ++i)
            c.push(i, keys[i], rows[i]);
        }
      };
      pull();  // verify before timing
      const embedding::uniform_init init{};
      for (std::size_t i = 0; i < step_tables; ++i)
        for (std::size_t r = 0; r < step_batch; r += 7)
          if (rows[i](r, 0) != init.value(i, keys[i][r], 0, dim))
            fail(errc::internal, cat("bench_ps: pulled row of table ", i, " is wrong"));
      push();
      stopwatch watch;
      for (int r = 0; r < rounds; ++r) {
        pull();
        pull_seconds += watch.lap();
        push();
        step_seconds += watch.lap();
      }
      step_seconds += pull_seconds;
      c.shutdown();
    }
    serving.join();
    if (server_error) std::rethrow_exception(server_error);
  });
  return {rounds / pull_seconds, rounds / step_seconds};
}

/// Local baseline of run_step: the same gathers and applies on a dense local table.
std::pair<double, double> run_step_local(std::size_t dim, int rounds,
                                         const std::vector<std::vector<std::uint64_t>>& keys) {
  std::vector<embedding::table_spec> specs;
  for (std::size_t t = 0; t < step_tables; ++t)
    specs.push_back({cat("t", t), vocab, dim});
  embedding::local<optim::sgd> tables(specs);
  std::vector<matrix<float>> rows;
  for (std::size_t i = 0; i < step_tables; ++i)
    rows.emplace_back(step_batch, dim);
  const double gather = bench::best_seconds(
      [&] {
        for (int r = 0; r < rounds; ++r)
          for (std::size_t i = 0; i < step_tables; ++i)
            tables.gather(i, keys[i], rows[i]);
      },
      3);
  const double step = bench::best_seconds(
      [&] {
        for (int r = 0; r < rounds; ++r)
          for (std::size_t i = 0; i < step_tables; ++i) {
            tables.gather(i, keys[i], rows[i]);
            tables.apply_gradients(i, keys[i], rows[i]);
          }
      },
      3);
  return {rounds / gather, rounds / step};
}

}  // namespace

int main(int argc, char** argv) {
  const auto opts = bench::options::parse(argc, argv, {"--step-only"});
  const bool step_only = !opts.rest.empty();  // only the trainer-step scenario
  std::vector<config> configs;
  if (step_only) {
  } else if (opts.quick) {
    configs = {{2, 1, 1, 16}, {4, 2, 2, 64}};
  } else {
    for (std::size_t dim : {std::size_t{16}, std::size_t{64}})
      for (auto [w, s] : {std::pair{2, 1}, std::pair{4, 2}, std::pair{8, 4}, std::pair{4, 1}})
        for (int threads : {1, 2})
          configs.push_back({w, s, threads, dim});
  }
  const int rounds = opts.quick ? 5 : 20;
  std::vector<bench::result> results;
  for (const auto& cfg : configs) {
    std::vector<std::vector<std::uint64_t>> keys;
    for (int w = 0; w < cfg.workers; ++w)
      keys.push_back(zipf_keys(batch, static_cast<std::uint64_t>(w)));
    const auto [local_pull, local_push] = run_local(cfg.dim, rounds, keys[0]);
    double pull = 0, push = 0;
    for (int rep = 0; rep < 2; ++rep) {  // best of 2
      const auto [p, q] = run_ps(cfg, rounds, keys);
      pull = std::max(pull, p);
      push = std::max(push, q);
    }
    const auto name = cat("W", cfg.workers, "_S", cfg.servers, "_T", cfg.threads, "_dim", cfg.dim);
    results.push_back({cat("ps_pull_", name), pull, "rows/s", local_pull, pull / local_pull});
    results.push_back({cat("ps_push_", name), push, "rows/s", local_push, push / local_push});
  }
  {
    const std::size_t dim = 16;
    const int step_rounds = opts.quick ? 50 : 400;
    std::vector<std::vector<std::uint64_t>> keys;
    for (std::size_t i = 0; i < step_tables; ++i)
      keys.push_back(zipf_keys(step_batch, 100 + i));
    const auto [local_pull, local_step] = run_step_local(dim, step_rounds, keys);
    for (const auto [batched, in_process] :
         {std::pair{false, false}, std::pair{true, false}, std::pair{true, true}}) {
      double pull = 0, step = 0;
      for (int rep = 0; rep < 3; ++rep) {  // best of 3
        const auto [p, q] = run_step(dim, step_rounds, batched, in_process, keys);
        pull = std::max(pull, p);
        step = std::max(step, q);
      }
      const auto name = cat(in_process ? "in_process"
                            : batched  ? "batched"
                                       : "per_table",
                            "_T", step_tables, "_b", step_batch, "_dim", dim);
      results.push_back(
          {cat("ps_step_pull_", name), pull, "rounds/s", local_pull, pull / local_pull});
      results.push_back({cat("ps_step_", name), step, "rounds/s", local_step, step / local_step});
    }
  }
  bench::report(opts, results);
}

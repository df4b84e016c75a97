/// @file bench_ps.cpp
/// Parameter-server pull and push throughput (rows/s) through a thread_world, against a
/// local-table gather / apply of the same keys timed in the same run.
///
/// Rows/s = workers × rounds × batch / seconds (rows as requested by the batch, duplicates
/// included). Keys are Zipf(1.05) over a 100 000-row table, so de-duplication matters.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
    c.pull(0, keys[w], rows);
    for (std::size_t i = 0; i < batch; i += 97)
      for (std::size_t j = 0; j < cfg.dim; ++j)
        if (rows(i, j) != init.value(0, keys[w][i], j, cfg.dim))
          fail(errc::internal, cat("bench_ps: pulled row of key ", keys[w][i], " is wrong"));
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

}  // namespace

int main(int argc, char** argv) {
  const auto opts = bench::options::parse(argc, argv);
  std::vector<config> configs;
  if (opts.quick) {
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
  bench::report(opts, results);
}

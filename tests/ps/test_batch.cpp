// Multi-table pull and push (ps::client::pull_tables / push_tables,
// embedding::sharded::gather_tables / apply_gradients_tables): bitwise the results of one call
// per table, and of a local table; every bad entry rejected before anything is sent.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "ps/harness.hpp"
#include "strata/core/rng.hpp"
#include "strata/embedding/local.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/sgd.hpp"
#include "strata/train/launch.hpp"
#include "support/ensure.hpp"

using namespace strata;
using ps_test::run_job;

namespace {

const std::vector<embedding::table_spec> specs = {
    {"a", 50, 4}, {"b", 0, 8}, {"c", 40, 3}, {"d", 7, 5}};

/// Keys of (worker, step, table): duplicates, an empty batch now and then, and for the
/// unbounded table "b" large 64-bit keys.
std::vector<std::uint64_t> keys_of(int worker, int step, std::size_t table,
                                   const std::vector<embedding::table_spec>& sp = specs) {
  const counter_rng rng{7, static_cast<std::uint64_t>(worker * 1000 + step * 10) + table};
  if ((step + worker + static_cast<int>(table)) % 5 == 4) return {};
  const std::size_t n = 3 + rng.below(0, 12);
  std::vector<std::uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint64_t rows = sp[table].rows == 0 ? 30 : sp[table].rows;
    keys[i] = rng.below(i + 1, rows);
    if (sp[table].rows == 0) keys[i] = keys[i] * 0x9E3779B97F4A7C15ull;
  }
  // Every kind of key list a pull handles: strictly ascending (in-process pulls read those
  // rows straight into the output), distinct but descending (they may not), and as drawn
  // (duplicates, any order).
  if (const int kind = (step + static_cast<int>(table)) % 3; kind != 0) {
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    if (kind == 2) std::reverse(keys.begin(), keys.end());
  }
  return keys;
}

float grad_of(int worker, int step, std::size_t i) {
  return std::sin(static_cast<float>(worker * 131 + step * 17) + static_cast<float>(i) * 0.37f);
}

/// Worker 0's step `step` over every table of `sp`: keys, gradients, buffers for the pulled
/// rows (`got`) and a reference's rows (`want`), and the multi-table entries that point at them.
struct step_batch {
  std::vector<std::vector<std::uint64_t>> keys;
  std::vector<matrix<float>> got, want, grads;
  std::vector<ps::table_pull> pulls;
  std::vector<ps::table_push> pushes;

  step_batch(int step, const std::vector<embedding::table_spec>& sp) {
    for (std::size_t tab = 0; tab < sp.size(); ++tab) {
      keys.push_back(keys_of(0, step, tab, sp));
      got.emplace_back(keys[tab].size(), sp[tab].dim);
      want.emplace_back(keys[tab].size(), sp[tab].dim);
      grads.emplace_back(keys[tab].size(), sp[tab].dim);
      for (std::size_t i = 0; i < grads[tab].size(); ++i)
        grads[tab].flat()[i] = grad_of(0, step, i + tab * 100);
    }
    for (std::size_t tab = 0; tab < sp.size(); ++tab) {
      pulls.push_back({tab, keys[tab], got[tab]});
      pushes.push_back({tab, keys[tab], grads[tab]});
    }
  }
  /// got[tab] is bitwise want[tab] (memcmp of zero bytes may see null pointers: an empty
  /// table's batch has no rows).
  [[nodiscard]] bool same_rows(std::size_t tab) const {
    return got[tab].size() == 0 ||
           std::memcmp(got[tab].data(), want[tab].data(), got[tab].size() * 4) == 0;
  }
};

/// How run_steps pulls: one call per table, one multi-table call, or split-phase — the pull
/// of step s begun right after the push of step s − 1 and finished at step s; the last two
/// also read the servers' rows in-process (`client_options::in_process_servers`).
enum class pull_mode { per_table, batched, split, in_process, in_process_split };

/// Every worker runs `steps` steps of (pull every table, push every table) and records every
/// pulled row; returns the records in worker order.
template <class Cons>
std::vector<std::vector<float>> run_steps(const ps::layout& roles, pull_mode mode, int steps,
                                          ps::client_options copts = {}) {
  const ps::shard_map map(roles, specs);
  comm::thread_world world(roles.ranks(), {.timeout_seconds = 30});
  std::vector<std::vector<float>> pulled(static_cast<std::size_t>(roles.workers()));
  run_job<Cons>(
      world, map, optim::adagrad{.lr = 0.3f},
      [&](auto& c, int w) {
        auto& record = pulled[static_cast<std::size_t>(w)];
        const auto n = static_cast<std::size_t>(steps);
        const bool split = mode == pull_mode::split || mode == pull_mode::in_process_split;
        std::vector<std::vector<std::vector<std::uint64_t>>> keys(n);
        std::vector<std::vector<matrix<float>>> rows(n), grads(n);
        std::vector<std::vector<ps::table_pull>> pulls(n);
        std::vector<std::vector<ps::table_push>> pushes(n);
        for (std::size_t step = 0; step < n; ++step) {
          for (std::size_t t = 0; t < specs.size(); ++t) {
            keys[step].push_back(keys_of(w, static_cast<int>(step), t));
            rows[step].emplace_back(keys[step][t].size(), specs[t].dim);
            grads[step].emplace_back(keys[step][t].size(), specs[t].dim);
            for (std::size_t i = 0; i < grads[step][t].size(); ++i)
              grads[step][t].flat()[i] = grad_of(w, static_cast<int>(step), i + t * 100);
          }
          // Tables in a scrambled order: the order of the entries must not matter.
          for (const std::size_t t :
               {std::size_t{2}, std::size_t{0}, std::size_t{3}, std::size_t{1}}) {
            pulls[step].push_back({t, keys[step][t], rows[step][t]});
            pushes[step].push_back({t, keys[step][t], grads[step][t]});
          }
        }
        if (split) c.begin_pull_tables(pulls[0]);
        for (std::size_t step = 0; step < n; ++step) {
          if (mode == pull_mode::batched || mode == pull_mode::in_process) {
            c.pull_tables(pulls[step]);
            c.push_tables(pushes[step]);
          } else if (split) {
            c.finish_pull_tables(pulls[step]);
            c.push_tables(pushes[step]);
            if (step + 1 < n) c.begin_pull_tables(pulls[step + 1]);
          } else {
            for (std::size_t t = 0; t < specs.size(); ++t)
              c.pull(t, keys[step][t], rows[step][t]);
            for (std::size_t t = 0; t < specs.size(); ++t)
              c.push(t, keys[step][t], grads[step][t]);
          }
          for (const auto& r : rows[step])
            record.insert(record.end(), r.flat().begin(), r.flat().end());
        }
        // The final state of every row any worker touched.
        for (std::size_t t = 0; t < specs.size(); ++t) {
          std::vector<std::uint64_t> all;
          for (int ww = 0; ww < roles.workers(); ++ww)
            for (int step = 0; step < steps; ++step)
              for (const auto k : keys_of(ww, step, t))
                all.push_back(k);
          matrix<float> r(all.size(), specs[t].dim);
          c.pull(t, all, r);
          record.insert(record.end(), r.flat().begin(), r.flat().end());
        }
      },
      {}, copts, {}, mode == pull_mode::in_process || mode == pull_mode::in_process_split);
  return pulled;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace

TEST_CASE("multi-table and split-phase pulls equal one call per table, bitwise", "[ps][batch]") {
  // Split-phase under sync and bounded: each pull is begun right after the previous step's
  // push, and the servers answer once that step is applied, so the rows are bitwise those of a
  // blocking pull at the same point.
  const auto all_equal = [](const std::vector<std::vector<float>>& a,
                            const std::vector<std::vector<float>>& b) {
    REQUIRE(a.size() == b.size());
    for (std::size_t w = 0; w < a.size(); ++w)
      REQUIRE(same_bits(a[w], b[w]));
  };
  SECTION("sync, 2 workers, 2 dedicated servers (pulls park, replies come out of order)") {
    const auto roles = ps::layout::dedicated(2, 2);
    const auto one = run_steps<ps::sync>(roles, pull_mode::per_table, 6);
    all_equal(one, run_steps<ps::sync>(roles, pull_mode::batched, 6));
    all_equal(one, run_steps<ps::sync>(roles, pull_mode::split, 6));
    all_equal(one, run_steps<ps::sync>(roles, pull_mode::in_process, 6));
    all_equal(one, run_steps<ps::sync>(roles, pull_mode::in_process_split, 6));
  }
  SECTION("sync, 3 co-located ranks, fp16 pulls") {
    const auto roles = ps::layout::colocated(3);
    const ps::client_options copts{.fp16_pulls = true};
    const auto one = run_steps<ps::sync>(roles, pull_mode::per_table, 5, copts);
    all_equal(one, run_steps<ps::sync>(roles, pull_mode::batched, 5, copts));
    all_equal(one, run_steps<ps::sync>(roles, pull_mode::split, 5, copts));
    all_equal(one, run_steps<ps::sync>(roles, pull_mode::in_process, 5, copts));
    all_equal(one, run_steps<ps::sync>(roles, pull_mode::in_process_split, 5, copts));
  }
  SECTION("bounded<1>, 1 worker, 3 servers") {
    const auto roles = ps::layout::dedicated(1, 3);
    const auto one = run_steps<ps::bounded<1>>(roles, pull_mode::per_table, 5);
    all_equal(one, run_steps<ps::bounded<1>>(roles, pull_mode::batched, 5));
    all_equal(one, run_steps<ps::bounded<1>>(roles, pull_mode::split, 5));
    all_equal(one, run_steps<ps::bounded<1>>(roles, pull_mode::in_process, 5));
    all_equal(one, run_steps<ps::bounded<1>>(roles, pull_mode::in_process_split, 5));
  }
  SECTION("async, 1 worker, 2 servers: in-process reads follow this worker's own pushes") {
    const auto roles = ps::layout::dedicated(1, 2);
    const auto one = run_steps<ps::async>(roles, pull_mode::per_table, 5);
    all_equal(one, run_steps<ps::async>(roles, pull_mode::in_process, 5));
  }
  SECTION("under sync a push while a begun pull is in flight is refused") {
    const ps::shard_map map(ps::layout::dedicated(1, 1), specs);
    comm::thread_world world(2, {.timeout_seconds = 30});
    bool checked = false;
    run_job<ps::sync>(world, map, optim::adagrad{}, [&](auto& c, int) {
      const std::vector<std::uint64_t> keys = {1, 2};
      matrix<float> rows(2, 4), grads(2, 4);
      const std::vector<ps::table_pull> pulls = {{0, keys, rows}};
      const std::vector<ps::table_push> pushes = {{0, keys, grads}};
      c.begin_pull_tables(pulls);
      bool refused = false;
      try {
        c.push_tables(pushes);
      } catch (const error& e) {
        refused =
            std::string(e.what()).find("finish_pull_tables it before pushing") != std::string::npos;
      }
      strata_test::ensure(refused, "a push during a begun pull was not refused under sync");
      strata_test::ensure(c.step(0) == 0, "the refused push advanced the step");
      c.finish_pull_tables(pulls);
      c.push_tables(pushes);
      checked = true;  // the only worker; read after the world joined
    });
    CHECK(checked);
  }
}

TEST_CASE("sharded gather_tables / apply_gradients_tables match a local table bitwise",
          "[ps][batch][sharded]") {
  using storage = embedding::sharded<optim::adagrad>;
  const optim::adagrad opt{.lr = 0.2f};
  const std::vector<embedding::table_spec> specs = {// local storage needs fixed tables
                                                    {"a", 50, 4},
                                                    {"b", 30, 8},
                                                    {"c", 40, 3},
                                                    {"d", 7, 5}};
  embedding::local<optim::adagrad> ref(specs, opt);
  // One rank that trains and serves (the trainer's co-located layout, server on a thread).
  const ps::shard_map map(ps::layout::colocated(1), specs);
  comm::thread_world world(1, {.timeout_seconds = 30});
  REQUIRE_NOTHROW(world.run([&](comm::thread_transport& t) {
    storage::server_type server(map, 0, opt);
    train::run_beside([&] { server.serve(t); },
                      [&] {
                        storage s(t, map);
                        for (int step = 0; step < 6; ++step) {
                          step_batch b(step, specs);
                          s.gather_tables(b.pulls);
                          for (std::size_t tab = 0; tab < specs.size(); ++tab) {
                            ref.gather(tab, b.keys[tab], b.want[tab]);
                            strata_test::ensure(b.same_rows(tab), "step ", step, " table ", tab,
                                                ": rows differ from the per-table reference");
                          }
                          s.apply_gradients_tables(b.pushes);
                          for (std::size_t tab = 0; tab < specs.size(); ++tab)
                            ref.apply_gradients(tab, b.keys[tab], b.grads[tab]);
                        }
                        s.shutdown();
                      });
  }));
}

TEST_CASE("multi-table calls reject a bad entry before sending anything", "[ps][batch][errors]") {
  const ps::shard_map map(ps::layout::dedicated(1, 2), specs);
  comm::thread_world world(3, {.timeout_seconds = 30});
  run_job<ps::sync>(world, map, optim::adagrad{}, [&](auto& c, int) {
    const std::vector<std::uint64_t> keys = {1, 2, 2}, bad = {1, 99};
    matrix<float> a(3, 4), c3(3, 3), wrong(3, 5), d(2, 5);
    const auto code_of = [](auto&& fn) {
      try {
        fn();
      } catch (const error& e) {
        return e.code();
      }
      return errc::internal;
    };
    // The same table twice.
    const std::vector<ps::table_pull> twice = {{0, keys, a}, {0, keys, a}};
    CHECK(code_of([&] { c.pull_tables(twice); }) == errc::invalid_argument);
    // A key outside the fixed table "d" (7 rows) in the second entry.
    const std::vector<ps::table_pull> out_of_range = {{0, keys, a}, {3, bad, d}};
    CHECK(code_of([&] { c.pull_tables(out_of_range); }) == errc::out_of_range);
    // An output of the wrong width.
    const std::vector<ps::table_pull> misshaped = {{2, keys, c3}, {0, keys, wrong}};
    CHECK(code_of([&] { c.pull_tables(misshaped); }) == errc::size_mismatch);
    // A table index that does not exist.
    const std::vector<ps::table_pull> no_table = {{0, keys, a}, {9, keys, a}};
    CHECK(code_of([&] { c.pull_tables(no_table); }) == errc::out_of_range);
    const std::vector<ps::table_push> bad_push = {{0, keys, a}, {3, bad, d}};
    CHECK(code_of([&] { c.push_tables(bad_push); }) == errc::out_of_range);
    const std::vector<ps::table_push> twice_push = {{2, keys, c3}, {2, keys, c3}};
    CHECK(code_of([&] { c.push_tables(twice_push); }) == errc::invalid_argument);
    // Nothing was sent: no step advanced, and a good batch still gets exactly its replies.
    for (std::size_t t = 0; t < specs.size(); ++t)
      CHECK(c.step(t) == 0);
    const std::vector<ps::table_pull> good = {{0, keys, a}, {2, keys, c3}};
    c.pull_tables(good);
    const embedding::uniform_init init{};
    CHECK(a(1, 3) == init.value(0, 2, 3, 4));
    CHECK(c3(0, 2) == init.value(2, 1, 2, 3));
    // An empty batch is a no-op.
    c.pull_tables({});
    c.push_tables({});
  });
}

TEST_CASE("split-phase pulls under async: the rows of when they left, misuse refused",
          "[ps][batch][sharded][async]") {
  using storage = embedding::sharded<optim::sgd, ps::async>;
  const optim::sgd opt{.lr = 0.3f};
  const std::vector<embedding::table_spec> specs = {{"a", 50, 4}, {"b", 30, 8}};
  embedding::local<optim::sgd> ref(specs, opt);
  const ps::shard_map map(ps::layout::colocated(1), specs);
  comm::thread_world world(1, {.timeout_seconds = 30});
  REQUIRE_NOTHROW(world.run([&](comm::thread_transport& t) {
    storage::server_type server(map, 0, opt);
    train::run_beside(
        [&] { server.serve(t); },
        [&] {
          storage s(t, map);
          for (int step = 0; step < 5; ++step) {
            step_batch b(step, specs);
            for (std::size_t tab = 0; tab < specs.size(); ++tab)
              ref.gather(tab, b.keys[tab], b.want[tab]);  // the rows before this step's push
            s.begin_gather_tables(b.pulls);
            strata_test::ensure(s.client().pull_in_flight(), "no pull in flight after begin");
            s.apply_gradients_tables(b.pushes);  // overlaps the pull; its rows must not show
            s.finish_gather_tables(b.pulls);
            for (std::size_t tab = 0; tab < specs.size(); ++tab) {
              strata_test::ensure(b.same_rows(tab), "step ", step, " table ", tab,
                                  ": rows differ from those before the push");
              ref.apply_gradients(tab, b.keys[tab], b.grads[tab]);
            }
          }
          // Misuse: finishing what was never begun, beginning twice, finishing other entries.
          const std::vector<std::uint64_t> k = {1, 2};
          matrix<float> out(2, 4);
          const std::vector<ps::table_pull> one = {{0, k, out}};
          const auto refused = [](auto&& fn, const char* words) {
            try {
              fn();
            } catch (const error& e) {
              return std::string(e.what()).find(words) != std::string::npos;
            }
            return false;
          };
          strata_test::ensure(refused([&] { s.finish_gather_tables(one); }, "no pull in flight"),
                              "finish without begin was not refused");
          s.begin_gather_tables(one);
          strata_test::ensure(refused([&] { s.begin_gather_tables(one); }, "still in flight"),
                              "a second begin was not refused");
          strata_test::ensure(refused([&] { s.gather_tables(one); }, "still in flight"),
                              "a blocking pull during a split one was not refused");
          strata_test::ensure(refused([&] { s.finish_gather_tables({}); }, "pass the same entries"),
                              "finishing other entries was not refused");
          s.finish_gather_tables(one);
          s.shutdown();
        });
  }));
}

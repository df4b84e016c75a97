// optim::table_groups: one storage, two optimizers by table. Every storage (local, hash_table,
// a parameter-server shard) must update each table exactly as a storage holding only that
// table's optimizer does.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "ps/harness.hpp"
#include "strata/embedding/hash_table.hpp"
#include "strata/embedding/local.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/ftrl.hpp"
#include "strata/optim/table_groups.hpp"
#include "support/ensure.hpp"

using namespace strata;

namespace {

using groups = optim::table_groups<optim::ftrl, optim::adagrad>;

const std::vector<embedding::table_spec> specs = {
    {"wide_a", 40, 1}, {"deep_a", 40, 8}, {"wide_b", 30, 1}, {"deep_b", 30, 8}};

groups make_groups() {
  groups g;
  g.first.alpha = 0.2f;
  g.second.lr = 0.1f;
  g.in_first = {true, false, true, false};
  return g;
}

/// Keys (with duplicates) and gradients of table t at step s.
std::vector<std::uint64_t> keys_of(std::size_t t, int s) {
  std::vector<std::uint64_t> keys;
  for (std::uint64_t i = 0; i < 24; ++i)
    keys.push_back((i * 7 + static_cast<std::uint64_t>(s) * 3 + t) % specs[t].rows / 2);
  return keys;
}
matrix<float> grads_of(std::size_t t, int s) {
  matrix<float> g(24, specs[t].dim);
  for (std::size_t i = 0; i < g.size(); ++i)
    g.flat()[i] = static_cast<float>(std::sin(0.7 * static_cast<double>(i) + s + 10.0 * t));
  return g;
}

/// Rows of `storage` for keys 0..rows-1 of table t, flattened.
template <class Storage>
std::vector<float> rows_of(Storage& storage, std::size_t t) {
  std::vector<std::uint64_t> keys(specs[t].rows);
  for (std::size_t k = 0; k < keys.size(); ++k)
    keys[k] = k;
  matrix<float> out(keys.size(), specs[t].dim);
  storage.gather(t, keys, out);
  return {out.flat().begin(), out.flat().end()};
}

/// Three steps of every table into `storage`.
template <class Storage>
void train_steps(Storage& storage) {
  for (int s = 0; s < 3; ++s)
    for (std::size_t t = 0; t < specs.size(); ++t)
      storage.apply_gradients(t, keys_of(t, s), grads_of(t, s));
}

}  // namespace

TEST_CASE("table_groups names both optimizers and keeps the larger state", "[optim][groups]") {
  STATIC_REQUIRE(optim::per_table_optimizer<groups>);
  STATIC_REQUIRE(optim::table_optimizer<groups>);
  STATIC_REQUIRE(!optim::sparse_optimizer<groups>);  // not a dense optimizer: no table there
  CHECK(std::string(groups::name) == "table_groups<ftrl,adagrad>");
  CHECK(groups::state_floats(8) == optim::ftrl::state_floats(8));
  CHECK(groups::state_floats(8) >= optim::adagrad::state_floats(8));
  const auto g = make_groups();
  CHECK(g.uses_first(0));
  CHECK(!g.uses_first(1));
  CHECK(!g.uses_first(99));  // beyond the mask: the second optimizer
  std::string seen;
  g.visit(2, [&](const auto& opt) { seen = std::decay_t<decltype(opt)>::name; });
  CHECK(seen == "ftrl");
  g.visit(3, [&](const auto& opt) { seen = std::decay_t<decltype(opt)>::name; });
  CHECK(seen == "adagrad");
}

TEST_CASE("local and hash tables update each table with its group's optimizer, bitwise",
          "[optim][groups][embedding]") {
  const auto g = make_groups();
  embedding::local<groups> grouped(specs, g);
  embedding::local<optim::ftrl> wide_only(specs, g.first);
  embedding::local<optim::adagrad> deep_only(specs, g.second);
  embedding::hash_table<groups> hashed(specs, g);
  train_steps(grouped);
  train_steps(wide_only);
  train_steps(deep_only);
  train_steps(hashed);
  for (std::size_t t = 0; t < specs.size(); ++t) {
    INFO("table " << t);
    const auto want = g.uses_first(t) ? rows_of(wide_only, t) : rows_of(deep_only, t);
    CHECK(rows_of(grouped, t) == want);
    CHECK(rows_of(hashed, t) == want);
    // and the other optimizer would have given other rows
    const auto other = g.uses_first(t) ? rows_of(deep_only, t) : rows_of(wide_only, t);
    CHECK(rows_of(grouped, t) != other);
  }
}

TEST_CASE("a parameter-server shard updates each table with its group's optimizer, bitwise",
          "[optim][groups][ps]") {
  const auto g = make_groups();
  embedding::local<groups> reference(specs, g);
  train_steps(reference);
  std::vector<std::vector<float>> want;
  for (std::size_t t = 0; t < specs.size(); ++t)
    want.push_back(rows_of(reference, t));
  const ps::shard_map map(ps::layout::dedicated(1, 2), specs);
  comm::thread_world world(3, {.timeout_seconds = 30});
  bool compared = false;
  ps_test::run_job<ps::sync>(world, map, g, [&](auto& c, int) {
    for (int s = 0; s < 3; ++s)
      for (std::size_t t = 0; t < specs.size(); ++t) {
        const auto grads = grads_of(t, s);
        c.push(t, keys_of(t, s), grads);
      }
    for (std::size_t t = 0; t < specs.size(); ++t) {
      std::vector<std::uint64_t> keys(specs[t].rows);
      for (std::size_t k = 0; k < keys.size(); ++k)
        keys[k] = k;
      matrix<float> out(keys.size(), specs[t].dim);
      c.pull(t, keys, out);
      strata_test::ensure(std::vector<float>(out.flat().begin(), out.flat().end()) == want[t],
                          "table ", t, ": the shard's rows differ from the local reference");
    }
    compared = true;  // the only worker; read after the world joined
  });
  CHECK(compared);
}

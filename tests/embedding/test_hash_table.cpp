#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/embedding.hpp"
#include "strata/optim.hpp"
#include "support/catch_error.hpp"

using strata_test::catch_error;

using namespace strata;
using namespace strata::embedding;

namespace {
/// Trains `s` for a few steps with duplicate keys on table 1.
template <class S>
void train_steps(S& s, std::size_t dim, std::uint64_t rows) {
  for (std::uint64_t step = 0; step < 5; ++step) {
    const std::size_t n = 3000;
    std::vector<std::uint64_t> keys(n);
    for (std::size_t i = 0; i < n; ++i)
      keys[i] = counter_rng{9, step}.below(i, rows / (step + 1));  // some rows skipped
    matrix<float> grads(n, dim);
    for (std::size_t i = 0; i < grads.size(); ++i)
      grads.flat()[i] = counter_rng{10, step}.normal(i);
    matrix<float> out(n, dim);
    s.gather(1, keys, out);
    s.apply_gradients(1, keys, grads.view());
  }
}
}  // namespace

TEST_CASE("hash_table models storage", "[embedding][hash_table]") {
  STATIC_REQUIRE(storage<hash_table<optim::sgd>>);
  STATIC_REQUIRE(storage<hash_table<optim::ftrl>>);
}

TEST_CASE("hash_table rows equal local rows for the same (seed, table, key)",
          "[embedding][hash_table]") {
  const std::vector<table_spec> specs{{"a", 50, 5}, {"b", 300, 12}};
  local<optim::sgd> dense(specs, {}, {.seed = 77});
  hash_table<optim::sgd> hashed(specs, {}, {.seed = 77});
  std::vector<std::uint64_t> keys(300);
  std::iota(keys.begin(), keys.end(), 0);
  std::reverse(keys.begin(), keys.end());
  matrix<float> a(300, 12), b(300, 12);
  dense.gather(1, keys, a);
  hashed.gather(1, keys, b);
  REQUIRE(std::equal(a.flat().begin(), a.flat().end(), b.flat().begin()));
  REQUIRE(hashed.size(1) == 300);
  REQUIRE(hashed.size(0) == 0);
}

TEMPLATE_TEST_CASE("hash_table trains exactly like local", "[embedding][hash_table]", optim::sgd,
                   optim::adagrad, optim::adam, optim::ftrl) {
  const std::vector<table_spec> specs{{"a", 10, 4}, {"b", 2000, 8}};
  local<TestType> dense(specs, {}, {.seed = 5});
  hash_table<TestType> hashed(specs, {}, {.seed = 5});
  train_steps(dense, 8, 2000);
  train_steps(hashed, 8, 2000);
  std::size_t rows = 0;
  hashed.for_each_row(1, [&](std::uint64_t k, std::span<const float> w, std::span<const float> s) {
    ++rows;
    REQUIRE(std::equal(w.begin(), w.end(), dense.row(1, k).begin()));
    REQUIRE(std::equal(s.begin(), s.end(), dense.state(1, k).begin()));
  });
  REQUIRE(rows == hashed.size(1));
  // Rows never touched in the hash table still hold their initial values in local.
  for (std::uint64_t k = 0; k < 2000; ++k)
    if (!hashed.contains(1, k))
      REQUIRE(dense.row(1, k)[0] == dense.initializer().value(1, k, 0, 8));
}

TEST_CASE("hash_table takes any 64-bit key, grows, and keeps rows in place",
          "[embedding][hash_table]") {
  hash_table<optim::adam> table({{"ids", 0, 4}}, {}, {.seed = 8});
  const std::vector<std::uint64_t> edge{0, ~std::uint64_t{0}, 1ull << 63, 12345};
  matrix<float> out(4, 4);
  REQUIRE_FALSE(table.contains(0, 0));
  table.gather(0, edge, out);  // creates the rows
  REQUIRE(table.size(0) == 4);
  for (auto k : edge)
    REQUIRE(table.contains(0, k));
  REQUIRE_FALSE(table.contains(0, 7));
  const float* first_row = table.row(0, edge[1]).data();

  const std::size_t n = 40000;
  std::vector<std::uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i)
    keys[i] = counter_rng{1, 2}.bits(i);  // random 64-bit keys
  matrix<float> rows(n, 4);
  table.gather(0, keys, rows);
  REQUIRE(table.size(0) == n + 4);
  REQUIRE(table.row(0, edge[1]).data() == first_row);  // arena rows never move
  const uniform_init& init = table.initializer();
  for (std::size_t i = 0; i < n; i += 97)
    for (std::size_t c = 0; c < 4; ++c)
      REQUIRE(rows(i, c) == init.value(0, keys[i], c, 4));
  const auto& ctable = table;
  REQUIRE(ctable.row(0, keys[5])[2] == rows(5, 2));
  REQUIRE(ctable.state(0, keys[5]).size() == optim::adam::state_floats(4));

  // Memory per row: (dim + state) floats + 8 B key + index slots at 35–70% load.
  const double per_row = static_cast<double>(table.memory_bytes(0)) / table.size(0);
  const double payload = (4 + optim::adam::state_floats(4)) * sizeof(float);
  REQUIRE(per_row > payload + 8);
  REQUIRE(per_row < payload + 8 + 16 / 0.35 + 8);
}

TEST_CASE("hash_table rejects bad input", "[embedding][hash_table][errors]") {
  hash_table<optim::sgd> table({{"free", 0, 3}, {"bounded", 20, 3}});
  matrix<float> out(1, 3), wide(1, 4);
  const std::vector<std::uint64_t> key{20};
  auto e = catch_error([&] { table.gather(1, key, out); });
  REQUIRE(e.code() == errc::out_of_range);
  REQUIRE_THAT(e.what(), Catch::Contains("key 20") && Catch::Contains("'bounded'") &&
                             Catch::Contains("[0, 20)"));
  REQUIRE(table.size(1) == 0);
  e = catch_error([&] { table.gather(0, key, wide); });
  REQUIRE(e.code() == errc::size_mismatch);
  e = catch_error([&] { table.apply_gradients(0, key, wide.view()); });
  REQUIRE(e.code() == errc::size_mismatch);
  REQUIRE(table.size(0) == 0);
  REQUIRE_THROWS_AS(table.gather(2, key, out), error);
  const auto& ctable = table;
  e = catch_error([&] { (void)ctable.row(0, 99); });
  REQUIRE(e.code() == errc::out_of_range);
  REQUIRE_THAT(e.what(), Catch::Contains("key 99 has no row"));
  REQUIRE_THROWS_AS((hash_table<optim::sgd>({{"flat", 0, 0}})), error);
}

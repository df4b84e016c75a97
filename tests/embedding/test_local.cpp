#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/embedding.hpp"
#include "strata/optim.hpp"
#include "support/catch_error.hpp"

using strata_test::catch_error;

using namespace strata;
using namespace strata::embedding;

namespace {
std::vector<table_spec> two_tables() {
  return {{"user", 100, 8}, {"item", 37, 3}};
}

}  // namespace

TEST_CASE("local models storage", "[embedding][local]") {
  STATIC_REQUIRE(storage<local<optim::sgd>>);
  STATIC_REQUIRE(storage<local<optim::adam>>);
  STATIC_REQUIRE_FALSE(storage<int>);
}

TEST_CASE("initial rows are uniform_init values of (seed, table, key)", "[embedding][init]") {
  const uniform_init init{.seed = 42};
  local<optim::sgd> tables(two_tables(), {}, init);
  REQUIRE(tables.table_count() == 2);
  REQUIRE(tables.spec(1).name == "item");
  double sum = 0, sum_sq = 0;
  const float a = 1.0f / std::sqrt(8.0f);
  for (std::uint64_t k = 0; k < 100; ++k) {
    const auto row = tables.row(0, k);
    for (std::size_t c = 0; c < 8; ++c) {
      REQUIRE(row[c] == init.value(0, k, c, 8));
      REQUIRE(row[c] >= -a);
      REQUIRE(row[c] < a);
      sum += row[c];
      sum_sq += row[c] * row[c];
    }
  }
  // uniform(-a, a): mean 0, variance a²/3 (800 samples: loose bounds).
  REQUIRE(std::abs(sum / 800) < 0.03);
  REQUIRE(sum_sq / 800 == Approx(a * a / 3).epsilon(0.15));
  // Tables, seeds and keys give different rows; scale overrides 1/sqrt(dim).
  REQUIRE(tables.row(0, 5)[0] != tables.row(0, 6)[0]);
  REQUIRE(init.value(0, 5, 0, 3) != init.value(1, 5, 0, 3));
  REQUIRE(uniform_init{.seed = 43}.value(0, 5, 0, 8) != init.value(0, 5, 0, 8));
  const uniform_init wide{.seed = 42, .scale = 3.0f};
  REQUIRE(wide.bound(0, 8) == 3.0f);
  // DLRM's rule: per-table ±sqrt(1/rows); unbounded tables get the fallback; table_scales
  // override scale only where given.
  const std::vector<std::uint64_t> table_rows{400, 0, 1'000'000};
  const auto dlrm = uniform_init::for_rows(42, table_rows, 0.25f);
  REQUIRE(dlrm.bound(0, 8) == 0.05f);
  REQUIRE(dlrm.bound(1, 8) == 0.25f);
  REQUIRE(dlrm.bound(2, 8) == 0.001f);
  REQUIRE(dlrm.bound(3, 8) == 0.25f);  // beyond the listed tables: scale
  for (std::size_t c = 0; c < 8; ++c) {
    REQUIRE(std::abs(dlrm.value(2, 77, c, 8)) <= 0.001f);
    // Same draw, another half-width: the values scale with it (u is shared).
    REQUIRE(dlrm.value(0, 77, c, 8) / 0.05f == Approx(init.value(0, 77, c, 8) / init.bound(0, 8)));
  }
  REQUIRE(std::abs(wide.value(0, 5, 0, 8)) <= 3.0f);
  std::vector<float> row(5);
  init.fill(1, 9, row);
  for (std::size_t c = 0; c < 5; ++c)
    REQUIRE(row[c] == init.value(1, 9, c, 5));
}

TEST_CASE("local gathers rows, duplicates included, serial and parallel", "[embedding][local]") {
  local<optim::sgd> tables({{"big", 5000, 16}}, {}, {.seed = 1});
  for (std::size_t n : {5u, 20000u}) {
    std::vector<std::uint64_t> keys(n);
    for (std::size_t i = 0; i < n; ++i)
      keys[i] = counter_rng{2, 0}.below(i, 5000);
    keys[n - 1] = keys[0];
    matrix<float> out(n, 16);
    tables.gather(0, keys, out);
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t c = 0; c < 16; ++c)
        REQUIRE(out(i, c) == tables.row(0, keys[i])[c]);
  }
}

TEST_CASE("local SGD step subtracts lr times the summed gradient of each key",
          "[embedding][local]") {
  local<optim::sgd> tables(two_tables(), {.lr = 0.5f}, {.seed = 3});
  const std::vector<std::uint64_t> keys{7, 2, 7, 36};
  matrix<float> grads(4, 3);
  for (std::size_t i = 0; i < grads.size(); ++i)
    grads.flat()[i] = static_cast<float>(i) * 0.25f;
  std::vector<std::vector<float>> before;
  for (std::uint64_t k : {2, 7, 36, 0})
    before.emplace_back(tables.row(1, k).begin(), tables.row(1, k).end());
  const auto untouched_other_table =
      std::vector<float>(tables.row(0, 7).begin(), tables.row(0, 7).end());
  tables.apply_gradients(1, keys, grads.view());
  for (std::size_t c = 0; c < 3; ++c) {
    REQUIRE(tables.row(1, 2)[c] == Approx(before[0][c] - 0.5f * grads(1, c)));
    REQUIRE(tables.row(1, 7)[c] == Approx(before[1][c] - 0.5f * (grads(0, c) + grads(2, c))));
    REQUIRE(tables.row(1, 36)[c] == Approx(before[2][c] - 0.5f * grads(3, c)));
    REQUIRE(tables.row(1, 0)[c] == before[3][c]);
  }
  REQUIRE(std::vector<float>(tables.row(0, 7).begin(), tables.row(0, 7).end()) ==
          untouched_other_table);
}

TEST_CASE("local exposes optimizer state and visits every row", "[embedding][local]") {
  local<optim::adagrad> tables({{"t", 10, 4}}, {.lr = 0.1f});
  REQUIRE(tables.state(0, 3).size() == 4);
  const std::vector<std::uint64_t> keys{3, 3};
  matrix<float> grads(2, 4);
  std::fill(grads.flat().begin(), grads.flat().end(), 1.0f);
  tables.apply_gradients(0, keys, grads.view());
  REQUIRE(tables.state(0, 3)[0] == 4.0f);  // (1 + 1)²
  REQUIRE(tables.state(0, 4)[0] == 0.0f);
  std::vector<std::uint64_t> seen;
  tables.for_each_row(0, [&](std::uint64_t k, std::span<const float> w, std::span<const float> s) {
    seen.push_back(k);
    REQUIRE(w.size() == 4);
    REQUIRE(s.size() == 4);
  });
  REQUIRE(seen.size() == 10);
  REQUIRE(std::is_sorted(seen.begin(), seen.end()));
  REQUIRE(tables.memory_bytes(0) == 10 * (4 + 4) * sizeof(float));
  REQUIRE(tables.weights(0).rows() == 10);
}

TEST_CASE("local rejects bad input with clear errors and changes nothing",
          "[embedding][local][errors]") {
  local<optim::sgd> tables(two_tables(), {.lr = 1.0f});
  const std::vector<std::uint64_t> keys{1, 37};
  matrix<float> out(2, 3);
  auto e = catch_error([&] { tables.gather(1, keys, out); });
  REQUIRE(e.code() == errc::out_of_range);
  REQUIRE_THAT(e.what(), Catch::Contains("key 37") && Catch::Contains("'item'") &&
                             Catch::Contains("[0, 37)"));

  const float before = tables.row(1, 1)[0];
  e = catch_error([&] { tables.apply_gradients(1, keys, out.view()); });
  REQUIRE(e.code() == errc::out_of_range);
  REQUIRE(tables.row(1, 1)[0] == before);  // validated before any update

  matrix<float> wrong_dim(2, 4), wrong_rows(3, 3);
  const std::vector<std::uint64_t> ok{1, 2};
  e = catch_error([&] { tables.gather(1, ok, wrong_dim); });
  REQUIRE(e.code() == errc::size_mismatch);
  REQUIRE_THAT(e.what(), Catch::Contains("2 x 4") && Catch::Contains("2 x 3"));
  e = catch_error([&] { tables.apply_gradients(1, ok, wrong_rows.view()); });
  REQUIRE(e.code() == errc::size_mismatch);

  e = catch_error([&] { tables.gather(2, ok, out); });
  REQUIRE(e.code() == errc::out_of_range);
  REQUIRE_THAT(e.what(), Catch::Contains("table index 2"));
  REQUIRE_THROWS_AS(tables.row(0, 100), error);
  REQUIRE_THROWS_AS(tables.spec(5), error);

  e = catch_error([] { local<optim::sgd> bad({{"free", 0, 4}}); });
  REQUIRE(e.code() == errc::invalid_argument);
  REQUIRE_THAT(e.what(), Catch::Contains("hash_table"));
  REQUIRE_THROWS_AS((local<optim::sgd>({{"flat", 4, 0}})), error);
}

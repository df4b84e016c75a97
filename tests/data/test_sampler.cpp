#include <catch2/catch.hpp>

#include <algorithm>
#include <set>
#include <vector>

#include "strata/data/sampler.hpp"

using namespace strata;
using namespace strata::data;

TEST_CASE("ranks are disjoint and together cover each epoch once", "[data][sampler]") {
  for (std::size_t n : {96u, 100u, 1001u}) {
    const std::size_t world = 4, global = 32;
    std::vector<sharded_sampler> ranks;
    for (std::size_t r = 0; r < world; ++r)
      ranks.emplace_back(n, world, r, global, 42);
    REQUIRE(ranks[0].steps_per_epoch() == n / global);
    REQUIRE(ranks[0].local_batch() == 8);
    for (std::uint64_t epoch = 0; epoch < 3; ++epoch) {
      CAPTURE(n, epoch);
      std::vector<int> seen(n, 0);
      for (auto& s : ranks)
        s.set_epoch(epoch);
      for (std::size_t t = 0; t < ranks[0].steps_per_epoch(); ++t)
        for (auto& s : ranks) {
          const auto b = s.batch(t);
          REQUIRE(b.size() == 8);
          for (std::size_t i : b) {
            REQUIRE(i < n);
            ++seen[i];
          }
        }
      REQUIRE(std::ranges::all_of(seen, [](int c) { return c <= 1; }));  // disjoint, no repeat
      REQUIRE(static_cast<std::size_t>(std::ranges::count(seen, 1)) ==
              (n / global) * global);  // only the last partial global batch is dropped
    }
  }
}

TEST_CASE("one worker with global batch G sees the union of W workers", "[data][sampler]") {
  const std::size_t n = 500, global = 60;
  for (std::size_t world : {2u, 3u, 6u}) {
    sharded_sampler single(n, 1, 0, global, 9);
    std::vector<sharded_sampler> ranks;
    for (std::size_t r = 0; r < world; ++r)
      ranks.emplace_back(n, world, r, global, 9);
    for (std::uint64_t epoch : {0u, 5u}) {
      single.set_epoch(epoch);
      for (auto& s : ranks)
        s.set_epoch(epoch);
      REQUIRE(single.steps_per_epoch() == ranks[0].steps_per_epoch());
      for (std::size_t t = 0; t < single.steps_per_epoch(); ++t) {
        std::vector<std::size_t> joined;
        for (auto& s : ranks)
          joined.insert(joined.end(), s.batch(t).begin(), s.batch(t).end());
        const auto one = single.batch(t);
        REQUIRE(std::equal(one.begin(), one.end(), joined.begin(), joined.end()));
        const auto g = ranks[1].global_indices(t);
        REQUIRE(std::equal(g.begin(), g.end(), joined.begin(), joined.end()));
      }
    }
  }
}

TEST_CASE("deterministic per (seed, epoch), reshuffled across epochs", "[data][sampler]") {
  sharded_sampler a(1000, 2, 1, 100, 7), b(1000, 2, 1, 100, 7), c(1000, 2, 1, 100, 8);
  auto perm = [](const sharded_sampler& s) {
    return std::vector<std::size_t>(s.permutation().begin(), s.permutation().end());
  };
  REQUIRE(perm(a) == perm(b));
  REQUIRE(perm(a) != perm(c));
  const auto epoch0 = perm(a);
  a.set_epoch(1);
  REQUIRE(a.epoch() == 1);
  REQUIRE(perm(a) != epoch0);
  auto sorted = perm(a);
  std::ranges::sort(sorted);
  for (std::size_t i = 0; i < sorted.size(); ++i)
    REQUIRE(sorted[i] == i);  // a permutation
  a.set_epoch(0);
  REQUIRE(perm(a) == epoch0);  // going back reproduces
  // Not the identity: a shuffled epoch puts most examples elsewhere.
  std::size_t fixed = 0;
  for (std::size_t i = 0; i < epoch0.size(); ++i)
    fixed += epoch0[i] == i ? 1 : 0;
  REQUIRE(fixed < 20);
}

TEST_CASE("sampler rejects bad configurations", "[data][sampler]") {
  REQUIRE_THROWS_WITH(sharded_sampler(100, 3, 0, 10, 0), Catch::Contains("multiple of world_size"));
  REQUIRE_THROWS_WITH(sharded_sampler(100, 2, 2, 10, 0), Catch::Contains("rank 2"));
  REQUIRE_THROWS_AS(sharded_sampler(100, 0, 0, 10, 0), error);
  REQUIRE_THROWS_WITH(sharded_sampler(5, 1, 0, 10, 0), Catch::Contains("larger than the dataset"));
  sharded_sampler s(100, 2, 0, 10, 0);
  REQUIRE(s.steps_per_epoch() == 10);
  try {
    (void)s.batch(10);
    FAIL("no exception");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::out_of_range);
    REQUIRE_THAT(e.what(), Catch::Contains("step 10"));
  }
}

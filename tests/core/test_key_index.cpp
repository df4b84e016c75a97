#include <catch2/catch.hpp>

#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "strata/core/key_index.hpp"

using namespace strata;

namespace {
/// Checks `index` against a plain std::unordered_map reference: same size, every key finds its
/// row, rows are dense in insertion order, absent keys are absent.
void expect_matches(const key_index& index,
                    const std::unordered_map<std::uint64_t, std::uint64_t>& ref,
                    const std::vector<std::uint64_t>& order, std::mt19937_64& rng) {
  REQUIRE(index.size() == ref.size());
  REQUIRE(index.keys().size() == order.size());
  for (std::size_t r = 0; r < order.size(); ++r) {
    REQUIRE(index.keys()[r] == order[r]);
    REQUIRE(index.find(order[r]) == r);
  }
  for (int i = 0; i < 1000; ++i) {
    const std::uint64_t key = rng();
    if (!ref.contains(key)) REQUIRE(index.find(key) == key_index::npos);
  }
}

/// Inserts `count` keys drawn by `draw` (duplicates included) into both.
template <class Draw>
void insert_keys(key_index& index, std::unordered_map<std::uint64_t, std::uint64_t>& ref,
                 std::vector<std::uint64_t>& order, std::size_t count, Draw draw) {
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t key = draw();
    const auto [row, inserted] = index.find_or_insert(key);
    const auto [it, fresh] = ref.try_emplace(key, order.size());
    if (fresh) order.push_back(key);
    REQUIRE(inserted == fresh);
    REQUIRE(row == it->second);
  }
}
}  // namespace

TEST_CASE("key_index maps keys to dense rows like a reference map", "[core][key_index]") {
  std::mt19937_64 rng(7);
  key_index index;
  REQUIRE(index.empty());
  REQUIRE(index.find(0) == key_index::npos);
  std::unordered_map<std::uint64_t, std::uint64_t> ref;
  std::vector<std::uint64_t> order;
  SECTION("edge keys: 0, the all-ones key and its neighbours are ordinary keys") {
    for (const std::uint64_t key : {std::uint64_t{0}, ~std::uint64_t{0}, ~std::uint64_t{0} - 1,
                                    std::uint64_t{1}, std::uint64_t{0}})
      insert_keys(index, ref, order, 1, [&] { return key; });
    expect_matches(index, ref, order, rng);
  }
  SECTION("many keys with duplicates, through several growths") {
    insert_keys(index, ref, order, 50'000, [&] { return rng() % 20'000; });
    expect_matches(index, ref, order, rng);
    REQUIRE(index.memory_bytes() >= index.size() * 24);
  }
  SECTION("keys that differ only in high bits (a weak hash would collide)") {
    std::uint64_t i = 0;
    insert_keys(index, ref, order, 5'000, [&] { return (i++ % 4'000) << 40; });
    expect_matches(index, ref, order, rng);
  }
}

TEST_CASE("key_index clear empties it, sparse or dense, and it is reusable", "[core][key_index]") {
  std::mt19937_64 rng(11);
  key_index index;
  // Sparse clears (few keys in a big index: only their slots are emptied) and dense clears,
  // each followed by a fresh set of keys that overlaps the previous one.
  index.reserve(100'000);
  for (const std::size_t count : {10u, 3'000u, 1u, 120'000u, 7u, 0u, 40'000u}) {
    std::unordered_map<std::uint64_t, std::uint64_t> ref;
    std::vector<std::uint64_t> order;
    insert_keys(index, ref, order, count, [&] { return rng() % (count * 2 + 1); });
    expect_matches(index, ref, order, rng);
    index.clear();
    REQUIRE(index.empty());
    for (const auto key : order)
      REQUIRE(index.find(key) == key_index::npos);
  }
}

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/optim/sparse_gradient.hpp"

using namespace strata;
using namespace strata::optim;

namespace {
/// Naive reference: std::map from key to a float row, summed in input order.
std::map<std::uint64_t, std::vector<float>> naive_sum(const std::vector<std::uint64_t>& keys,
                                                      const matrix<float>& grads) {
  std::map<std::uint64_t, std::vector<float>> out;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    auto [it, fresh] = out.try_emplace(keys[i], grads.row(i).begin(), grads.row(i).end());
    if (!fresh)
      for (std::size_t c = 0; c < grads.cols(); ++c)
        it->second[c] += grads(i, c);
  }
  return out;
}

void check(sparse_gradient& work, std::size_t n, std::size_t dim, std::uint64_t key_range,
           std::uint64_t seed) {
  const counter_rng rng{seed, 0};
  std::vector<std::uint64_t> keys(n);
  for (std::size_t i = 0; i < n; ++i)
    keys[i] = rng.below(i, key_range) * 0x100000001ull;  // large, sparse key values
  matrix<float> grads(n, dim);
  for (std::size_t i = 0; i < grads.size(); ++i)
    grads.flat()[i] = counter_rng{seed, 1}.normal(i);
  work.sum_duplicates(keys, grads.view());
  const auto expected = naive_sum(keys, grads);
  REQUIRE(work.size() == expected.size());
  REQUIRE(work.dim() == dim);
  std::size_t g = 0, total = 0;
  for (const auto& [key, row] : expected) {
    REQUIRE(work.keys()[g] == key);
    total += work.count(g);
    for (std::size_t c = 0; c < dim; ++c)
      REQUIRE(work.grads()(g, c) == row[c]);  // bitwise: same summation order
    ++g;
  }
  REQUIRE(total == n);
}
}  // namespace

TEST_CASE("sum_duplicates equals a naive map-based sum, bitwise", "[optim][sparse_gradient]") {
  sparse_gradient work;  // reused across sizes: buffers shrink and grow
  check(work, 0, 4, 10, 1);
  check(work, 1, 4, 10, 2);
  check(work, 50, 3, 5, 3);
  check(work, 1000, 8, 100, 4);
  check(work, 20000, 16, 3000, 5);  // parallel path
  check(work, 7, 1, 1000000, 6);
  check(work, 300, 64, 1, 7);  // all one key
}

TEST_CASE("sum_duplicates keeps already-sorted unique keys as they are",
          "[optim][sparse_gradient]") {
  const std::vector<std::uint64_t> keys{1, 5, 9};
  matrix<float> grads(3, 2);
  for (std::size_t i = 0; i < 6; ++i)
    grads.flat()[i] = static_cast<float>(i);
  const auto out = sum_duplicates(keys, grads.view());
  REQUIRE(out.keys == keys);
  REQUIRE(std::vector<float>(out.grads.flat().begin(), out.grads.flat().end()) ==
          std::vector<float>{0, 1, 2, 3, 4, 5});
}

TEST_CASE("sum_duplicates one-shot form", "[optim][sparse_gradient]") {
  const std::vector<std::uint64_t> keys{4, 2, 4, 4, 2};
  matrix<float> grads(5, 1);
  for (std::size_t i = 0; i < 5; ++i)
    grads(i, 0) = static_cast<float>(i + 1);
  const auto out = sum_duplicates(keys, grads.view());
  REQUIRE(out.keys == std::vector<std::uint64_t>{2, 4});
  REQUIRE(out.grads(0, 0) == 2.0f + 5.0f);
  REQUIRE(out.grads(1, 0) == 1.0f + 3.0f + 4.0f);
}

TEST_CASE("sum_duplicates rejects a gradient row count that differs from the keys",
          "[optim][sparse_gradient]") {
  const std::vector<std::uint64_t> keys{1, 2, 3};
  matrix<float> grads(2, 4);
  try {
    (void)sum_duplicates(keys, grads.view());
    FAIL("no error");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::size_mismatch);
    REQUIRE_THAT(e.what(), Catch::Contains("3 keys") && Catch::Contains("2 gradient rows"));
  }
}

TEST_CASE("key_groups: first-seen or ascending groups, members in input order, shares",
          "[optim][sparse_gradient]") {
  key_groups groups;
  const std::vector<std::uint64_t> keys{7, 3, 7, 7, 1ull << 60, 3, 9};
  groups.group(keys);
  REQUIRE(std::vector<std::uint64_t>(groups.keys().begin(), groups.keys().end()) ==
          std::vector<std::uint64_t>{7, 3, 1ull << 60, 9});
  REQUIRE(std::vector<std::uint32_t>(groups.members(0).begin(), groups.members(0).end()) ==
          std::vector<std::uint32_t>{0, 2, 3});
  REQUIRE(std::vector<std::uint32_t>(groups.members(1).begin(), groups.members(1).end()) ==
          std::vector<std::uint32_t>{1, 5});
  REQUIRE(groups.max_key() == 1ull << 60);
  REQUIRE(groups.member_count() == keys.size());
  groups.group(keys, group_order::ascending_key);
  REQUIRE(std::vector<std::uint64_t>(groups.keys().begin(), groups.keys().end()) ==
          std::vector<std::uint64_t>{3, 7, 9, 1ull << 60});
  REQUIRE(std::vector<std::uint32_t>(groups.members(1).begin(), groups.members(1).end()) ==
          std::vector<std::uint32_t>{0, 2, 3});

  // Bags: a key twice in one bag lists that bag twice; empty bags contribute nothing.
  const std::vector<std::uint64_t> bag_keys{5, 5, 2, 5};
  const std::vector<std::uint64_t> offsets{0, 2, 2, 4};
  groups.group_bags(bag_keys, offsets);
  REQUIRE(groups.size() == 2);
  REQUIRE(std::vector<std::uint32_t>(groups.members(0).begin(), groups.members(0).end()) ==
          std::vector<std::uint32_t>{0, 0, 2});
  REQUIRE(std::vector<std::uint32_t>(groups.members(1).begin(), groups.members(1).end()) ==
          std::vector<std::uint32_t>{2});

  // Many keys (the index grows several times from a small start), then shares: disjoint,
  // together the same groups with the same members.
  const counter_rng rng{3, 0};
  std::vector<std::uint64_t> many;
  std::vector<std::uint64_t> bag_offsets{0};
  for (std::size_t bag = 0; bag < 5000; ++bag) {  // 0..9 keys per bag, skewed: duplicates
    const std::size_t len = rng.below(2 * bag, 10);
    for (std::size_t j = 0; j < len; ++j)
      many.push_back(rng.below(2 * bag + 1 + (j << 32), j % 2 ? 1u << 20 : 300));
    bag_offsets.push_back(many.size());
  }
  groups.group(std::span<const std::uint64_t>(many).first(10));  // sizes the index small
  groups.group_bags(many, bag_offsets);
  std::map<std::uint64_t, std::vector<std::uint32_t>> all;
  for (std::size_t g = 0; g < groups.size(); ++g)
    all[groups.key(g)].assign(groups.members(g).begin(), groups.members(g).end());
  std::map<std::uint64_t, std::vector<std::uint32_t>> want;
  for (std::size_t bag = 0; bag + 1 < bag_offsets.size(); ++bag)
    for (std::size_t i = bag_offsets[bag]; i < bag_offsets[bag + 1]; ++i)
      want[many[i]].push_back(static_cast<std::uint32_t>(bag));
  REQUIRE(all == want);
  std::map<std::uint64_t, std::vector<std::uint32_t>> joined;
  for (std::size_t p = 0; p < 3; ++p) {
    key_groups share;
    share.group_bags(many, bag_offsets, group_order::first_seen, {p, 3});
    REQUIRE(share.max_key() == groups.max_key());
    for (std::size_t g = 0; g < share.size(); ++g) {
      REQUIRE(joined.count(share.key(g)) == 0);
      joined[share.key(g)].assign(share.members(g).begin(), share.members(g).end());
    }
  }
  REQUIRE(joined == want);
}

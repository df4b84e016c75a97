#include <catch2/catch.hpp>

#include <vector>

#include "strata/data/batch.hpp"

using namespace strata;
using namespace strata::data;

namespace {
ctr_dataset make(std::size_t n) {
  ctr_dataset ds;
  std::vector<float> dense(13);
  std::vector<std::uint64_t> keys(26);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t j = 0; j < 13; ++j)
      dense[j] = static_cast<float>(i * 100 + j);
    for (std::size_t f = 0; f < 26; ++f)
      keys[f] = i * 1000 + f;
    ds.append(dense, keys, static_cast<float>(i % 2));
  }
  return ds;
}
}  // namespace

TEST_CASE("gather copies the requested examples in order, repeats allowed", "[data][batch]") {
  const auto ds = make(10);
  REQUIRE(ds.size() == 10);
  const std::vector<std::size_t> idx = {7, 2, 7, 0};
  ctr_batch b = ds.gather(idx);
  REQUIRE(b.size() == 4);
  REQUIRE(b.dense.rows() == 4);
  REQUIRE(b.dense.cols() == 13);
  REQUIRE(b.keys.cols() == 26);
  for (std::size_t i = 0; i < idx.size(); ++i) {
    REQUIRE(b.labels[i] == static_cast<float>(idx[i] % 2));
    REQUIRE(b.dense(i, 12) == static_cast<float>(idx[i] * 100 + 12));
    REQUIRE(b.keys(i, 25) == idx[i] * 1000 + 25);
  }
  // Reuse: same shape keeps the allocation.
  const float* before = b.dense.data();
  const std::vector<std::size_t> idx2 = {1, 3, 5, 9};
  ds.gather(idx2, b);
  REQUIRE(b.dense.data() == before);
  REQUIRE(b.keys(3, 0) == 9000);
}

TEST_CASE("append a batch, and bad shapes or indices are rejected", "[data][batch]") {
  const auto ds = make(5);
  const std::vector<std::size_t> all = {0, 1, 2, 3, 4};
  ctr_dataset copy;
  copy.append(ds.gather(all));
  REQUIRE(copy.size() == 5);
  REQUIRE(
      std::equal(copy.keys().flat().begin(), copy.keys().flat().end(), ds.keys().flat().begin()));
  const std::vector<std::size_t> bad = {1, 5};
  try {
    (void)ds.gather(bad);
    FAIL("no exception");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::out_of_range);
    REQUIRE_THAT(e.what(), Catch::Contains("index 5"));
  }
  std::vector<float> dense(12);
  std::vector<std::uint64_t> keys(26);
  REQUIRE_THROWS_AS(copy.append(dense, keys, 1.0f), error);
  ctr_dataset narrow(2, 3);
  ctr_batch b;
  b.resize(1);
  REQUIRE_THROWS_AS(narrow.append(b), error);
}

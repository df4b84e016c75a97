#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/data/ctr_binary.hpp"
#include "strata/data/ctr_vocabulary.hpp"

#include "support/catch_error.hpp"
#include "support/ctr_batches.hpp"
#include "support/temp_dir.hpp"

using namespace strata;
using namespace strata::data;
using strata_test::all_examples;
using strata_test::catch_error;
using strata_test::contains;
using strata_test::flip_byte;
namespace fs = std::filesystem;

namespace {

constexpr std::uint64_t hashed_rows = 5000;

/// Key of example i, column c: half of the draws among 3 + c small keys (frequent), the rest
/// spread over the table (mostly seen once or twice).
std::uint64_t raw_key(std::size_t i, std::size_t c, std::uint64_t rows = hashed_rows) {
  const std::uint64_t h = mix_ids(i, c + 1);
  return (h & 1) != 0 ? (h >> 8) % (3 + c) : (h >> 8) % rows;
}

/// A .ctrb day of examples [first, first + n) with raw_key keys; dense value 0 holds i.
fs::path write_day(const fs::path& path, std::size_t first, std::size_t n,
                   std::uint64_t rows = hashed_rows, std::uint64_t seed = 0) {
  fs::create_directories(path.parent_path());
  ctr_file_schema schema;
  schema.table_rows = {rows};
  schema.hash_seed = seed;
  schema.chunk_rows = 100;
  ctr_binary_writer w(path, schema);
  std::vector<float> dense(criteo_dense_columns), labels(1);
  std::vector<std::uint64_t> keys(criteo_sparse_columns);
  for (std::size_t i = first; i < first + n; ++i) {
    dense[0] = static_cast<float>(i);
    for (std::size_t c = 0; c < keys.size(); ++c)
      keys[c] = raw_key(i, c, rows);
    labels[0] = static_cast<float>(i % 2);
    w.append(dense, keys, labels);
  }
  w.finish();
  return path;
}

/// The reference: per column, the keys of examples [0, n) counted at least `min_count`
/// times, ascending (std::map counts).
std::vector<std::vector<std::uint64_t>> naive_frequent(std::size_t n, std::uint64_t min_count) {
  std::vector<std::vector<std::uint64_t>> frequent(criteo_sparse_columns);
  for (std::size_t c = 0; c < criteo_sparse_columns; ++c) {
    std::map<std::uint64_t, std::uint64_t> counts;
    for (std::size_t i = 0; i < n; ++i)
      ++counts[raw_key(i, c)];
    for (const auto& [key, count] : counts)
      if (count >= min_count) frequent[c].push_back(key);
  }
  return frequent;
}

/// The row the reference gives `key` of column c: its rank among the frequent keys, or the
/// number of frequent keys (the rare row).
std::uint64_t naive_row(const std::vector<std::vector<std::uint64_t>>& frequent, std::size_t c,
                        std::uint64_t key) {
  const auto& f = frequent[c];
  const auto it = std::lower_bound(f.begin(), f.end(), key);
  return it != f.end() && *it == key ? static_cast<std::uint64_t>(it - f.begin()) : f.size();
}

}  // namespace

TEST_CASE("ctr_vocabulary: frequent keys keep rows in key order, the rest share the last row",
          "[data][ctr_vocabulary]") {
  strata_test::temp_dir dir("ctrv_rows");
  const auto days = dir.path / "days";
  write_day(days / "day_0.ctrb", 0, 3000);
  write_day(days / "day_1.ctrb", 3000, 2000);
  const std::uint64_t min_count = GENERATE(1, 2, 4);
  const auto expected = naive_frequent(5000, min_count);

  const ctr_files raw(days);
  CHECK(raw.vocabulary() == nullptr);
  CHECK(raw.table_rows() == raw.schema().table_rows);
  const auto vocabulary = build_ctr_vocabulary(raw, min_count);
  REQUIRE(vocabulary.tables() == criteo_sparse_columns);
  CHECK(vocabulary.source().examples == 5000);
  CHECK(vocabulary.source().counted_files == std::vector<std::string>{"day_0.ctrb", "day_1.ctrb"});
  for (std::size_t c = 0; c < criteo_sparse_columns; ++c) {
    const auto keys = vocabulary.frequent_keys(c);
    CHECK(std::vector<std::uint64_t>(keys.begin(), keys.end()) == expected[c]);
    CHECK(vocabulary.rows(c) == expected[c].size() + 1);
    CHECK(vocabulary.rare_row(c) == expected[c].size());
    CHECK(vocabulary.hash_rows(c) == hashed_rows);
  }
  if (min_count == 1) {  // every key seen keeps a row: no collision of seen keys
    for (std::size_t c = 0; c < criteo_sparse_columns; ++c)
      CHECK(vocabulary.rows(c) > 3 + c);
  }
  vocabulary.save(days / std::string(ctr_vocabulary_name));

  // The same folder now reads through the vocabulary, and so does a day converted into it
  // later (examples [5000, 6500): ids unseen in the counted days go to the rare row).
  write_day(days / "day_2.ctrb", 5000, 1500);
  const ctr_files mapped(days);
  REQUIRE(mapped.vocabulary() != nullptr);
  CHECK(mapped.vocabulary()->fingerprint() == vocabulary.fingerprint());
  CHECK(mapped.schema().table_rows == raw.schema().table_rows);  // the files' own hashing
  CHECK(mapped.table_rows() == vocabulary.table_rows());
  CHECK(contains(mapped.describe(), cat("frequency threshold ", min_count)));
  const auto batch = all_examples(mapped);
  REQUIRE(batch.size() == 6500);
  std::size_t rare = 0;
  for (std::size_t r = 0; r < batch.size(); ++r) {
    const auto i = static_cast<std::size_t>(batch.dense(r, 0));
    REQUIRE(i == r);
    for (std::size_t c = 0; c < criteo_sparse_columns; ++c) {
      const auto want = naive_row(expected, c, raw_key(i, c));
      REQUIRE(batch.keys(r, c) == want);
      rare += want == expected[c].size();
    }
  }
  if (min_count > 1) CHECK(rare > 0);
  // A single file of the folder reads through the folder's vocabulary too.
  const ctr_files eval_day(days / "day_2.ctrb");
  CHECK(eval_day.vocabulary() != nullptr);
  CHECK(eval_day.table_rows() == vocabulary.table_rows());

  // Training loaders read through it: an epoch's keys are a permutation of gather's.
  auto loader = mapped.loader({.world_size = 1, .global_batch = 100, .seed = 3});
  std::vector<std::uint64_t> loaded, gathered(batch.keys.flat().begin(), batch.keys.flat().end());
  ctr_batch b;
  for (std::size_t step = 0; step < loader->steps_per_epoch(); ++step) {
    loader->load(step, b);
    loaded.insert(loaded.end(), b.keys.flat().begin(), b.keys.flat().end());
  }
  std::sort(loaded.begin(), loaded.end());
  std::sort(gathered.begin(), gathered.end());
  CHECK(loaded == gathered);
}

TEST_CASE("ctr_vocabulary: a threshold above every count leaves one row per table",
          "[data][ctr_vocabulary]") {
  strata_test::temp_dir dir("ctrv_all_rare");
  write_day(dir.path / "day_0.ctrb", 0, 500);
  const auto vocabulary = build_ctr_vocabulary(ctr_files(dir.path), 100000);
  vocabulary.save(dir.path / std::string(ctr_vocabulary_name));
  const ctr_files mapped(dir.path);
  CHECK(mapped.table_rows() == std::vector<std::uint64_t>(criteo_sparse_columns, 1));
  const auto batch = all_examples(mapped);
  for (const auto key : batch.keys.flat())
    REQUIRE(key == 0);
}

TEST_CASE("ctr_vocabulary: dense and key_index lookups agree; save and load keep it whole",
          "[data][ctr_vocabulary]") {
  // Table 0 maps through a dense array, table 1 (2^27 hashed rows) through a key_index.
  const std::uint64_t big = std::uint64_t{1} << 27;
  ctr_key_counts counts({1000, big});
  for (std::uint64_t i = 0; i < 5000; ++i) {
    const std::uint64_t key = (i * i) % 997;
    counts.add(0, key);
    counts.add(1, key);
  }
  CHECK(counts.count(0, 0) == counts.count(1, 0));
  CHECK(counts.count(1, big - 1) == 0);
  const ctr_vocabulary v(counts,
                         {.min_count = 6, .hash_seed = 9, .examples = 5000, .counted_files = {}});
  REQUIRE(v.rows(0) == v.rows(1));
  CHECK(v.rows(0) > 1);
  CHECK(v.rows(0) < 998);
  for (std::uint64_t key = 0; key < 1000; ++key) {
    REQUIRE(v.map(0, key) == v.map(1, key));
    REQUIRE((v.map(0, key) == v.rare_row(0)) == (counts.count(0, key) < 6));
  }
  CHECK(v.map(1, big - 1) == v.rare_row(1));

  strata_test::temp_dir dir("ctrv_roundtrip");
  const auto path = dir.path / "v.ctrv";
  v.save(path);
  const auto back = ctr_vocabulary::load(path);
  CHECK(back.fingerprint() == v.fingerprint());
  CHECK(back.min_count() == 6);
  CHECK(back.hash_seed() == 9);
  CHECK(back.table_rows() == v.table_rows());
  for (std::uint64_t key = 0; key < 1000; ++key)
    REQUIRE(back.map(1, key) == v.map(1, key));

  // Another threshold is another vocabulary.
  const ctr_vocabulary other(
      counts, {.min_count = 7, .hash_seed = 9, .examples = 5000, .counted_files = {}});
  CHECK(other.fingerprint() != v.fingerprint());
}

TEST_CASE("ctr_vocabulary: damaged, mismatched and mixed vocabularies are refused",
          "[data][ctr_vocabulary][errors]") {
  strata_test::temp_dir dir("ctrv_bad");
  const auto a = dir.path / "a";
  write_day(a / "day_0.ctrb", 0, 800);
  const auto vocabulary = build_ctr_vocabulary(ctr_files(a), 2);
  const auto saved = dir.path / "saved.ctrv";
  vocabulary.save(saved);
  const auto place = [&](const fs::path& folder) {
    fs::create_directories(folder);
    fs::copy_file(saved, folder / std::string(ctr_vocabulary_name),
                  fs::copy_options::overwrite_existing);
    return folder / std::string(ctr_vocabulary_name);
  };

  SECTION("a flipped byte or a truncated file") {
    const auto p = place(a);
    flip_byte(p, fs::file_size(p) / 2);
    auto e = catch_error([&] { (void)ctr_files(a); });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "fails its checksum"));
    CHECK(contains(e.what(), "strata_convert --min-count"));
    fs::resize_file(p, 20);
    e = catch_error([&] { (void)ctr_vocabulary::load(p); });
    CHECK(e.code() == errc::corrupt_data);
    fs::resize_file(p, 3);
    CHECK(catch_error([&] { (void)ctr_vocabulary::load(p); }).code() == errc::corrupt_data);
  }
  SECTION("days hashed otherwise than the vocabulary") {
    const auto b = dir.path / "b";
    write_day(b / "day_0.ctrb", 0, 300, 4000);
    place(b);
    auto e = catch_error([&] { (void)ctr_files(b); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "hashed otherwise"));
    CHECK(contains(e.what(), "4000 rows"));
    const auto c = dir.path / "c";
    write_day(c / "day_0.ctrb", 0, 300, hashed_rows, 77);
    place(c);
    e = catch_error([&] { (void)ctr_files(c); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "seed 77"));
  }
  SECTION("days read together through different vocabularies, or one without") {
    place(a);
    const auto b = dir.path / "b";
    write_day(b / "day_1.ctrb", 800, 400);
    auto e = catch_error([&] { (void)ctr_files({a / "day_0.ctrb", b / "day_1.ctrb"}); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "has none beside it"));
    build_ctr_vocabulary(ctr_files(b), 1).save(b / std::string(ctr_vocabulary_name));
    e = catch_error([&] { (void)ctr_files({a / "day_0.ctrb", b / "day_1.ctrb"}); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "different vocabularies"));
    // The same vocabulary in two folders reads alike.
    place(b);
    CHECK(ctr_files({a / "day_0.ctrb", b / "day_1.ctrb"}).table_rows() == vocabulary.table_rows());
  }
  SECTION("counting through a vocabulary, a zero threshold, counters of other tables") {
    place(a);
    const ctr_files mapped(a);
    auto e = catch_error([&] { (void)build_ctr_vocabulary(mapped, 2); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "read through a vocabulary already"));
    fs::remove(a / std::string(ctr_vocabulary_name));
    const ctr_files raw(a);
    CHECK(catch_error([&] { (void)build_ctr_vocabulary(raw, 0); }).code() ==
          errc::invalid_argument);
    ctr_key_counts wrong(std::vector<std::uint64_t>(criteo_sparse_columns, 10));
    CHECK(catch_error([&] { raw.count_keys(wrong); }).code() == errc::invalid_argument);
    CHECK(catch_error([] { (void)ctr_key_counts({}); }).code() == errc::invalid_argument);
  }
}

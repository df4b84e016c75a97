#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/data/ctr_binary.hpp"
#include "strata/data/synthetic.hpp"

#include "support/catch_error.hpp"
#include "support/ctr_batches.hpp"
#include "support/temp_dir.hpp"

using namespace strata;
using namespace strata::data;
using strata_test::all_examples;
using strata_test::catch_error;
using strata_test::contains;
using strata_test::flip_byte;
using strata_test::same_bits;
namespace fs = std::filesystem;

namespace {

/// A .ctrb file of `n` examples written directly: example i has label i % 2, dense values
/// i + column / 100 and key (i · 31 + column) % rows — every example is recognisable.
fs::path write_numbered(const fs::path& path, std::size_t n, std::size_t chunk_rows,
                        std::uint64_t rows = 1000, std::size_t first = 0) {
  fs::create_directories(path.parent_path());
  ctr_file_schema schema;
  schema.table_rows = {rows};
  schema.chunk_rows = chunk_rows;
  ctr_binary_writer w(path, schema);
  std::vector<float> dense(criteo_dense_columns), labels(1);
  std::vector<std::uint64_t> keys(criteo_sparse_columns);
  for (std::size_t i = first; i < first + n; ++i) {
    for (std::size_t c = 0; c < dense.size(); ++c)
      dense[c] = static_cast<float>(i) + static_cast<float>(c) / 100.0f;
    for (std::size_t c = 0; c < keys.size(); ++c)
      keys[c] = (i * 31 + c) % rows;
    labels[0] = static_cast<float>(i % 2);
    w.append(dense, keys, labels);
  }
  w.finish();
  return path;
}

/// The example number of row r of a batch of write_numbered examples.
std::size_t number_of(const ctr_batch& b, std::size_t r) {
  return static_cast<std::size_t>(b.dense(r, 0));
}

/// The chunk of example number n in the loader test's two files (a: 0..5999, b: 6000..9999,
/// chunks of 64 from each file's start).
std::size_t chunk_id(std::size_t n) {
  return n < 6000 ? n / 64 : 1000 + (n - 6000) / 64;
}

/// Resident file-backed pages of this process, in bytes (/proc/self/status RssFile).
std::size_t resident_file_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("RssFile:", 0) == 0) return std::stoull(line.substr(8)) * 1024;
  return 0;
}

}  // namespace

TEST_CASE("convert_criteo: the same examples as the streaming reader, in order",
          "[data][ctr_binary]") {
  strata_test::temp_dir dir("ctrb_convert");
  synthetic_criteo gen;
  gen.rows = 5000;
  gen.seed = 7;
  gen.threads = 1;
  const auto tsv = dir.path / "day_0.tsv";
  write_synthetic_criteo(tsv, gen);
  criteo_options options;
  options.table_rows = {5000};
  options.hash_seed = 3;
  const ctr_dataset expected = load_criteo(tsv, options);
  // Small blocks: lines straddle many block ends; chunks of 300 leave a partial last chunk.
  const auto report = convert_criteo(tsv, dir.path / "day_0.ctrb", options,
                                     {.chunk_rows = 300, .block_bytes = 4096, .threads = 2});
  CHECK(report.summary.examples == 5000);
  CHECK(report.summary.lines_read == 5000);
  CHECK(report.tsv_bytes == fs::file_size(tsv));
  CHECK(report.output_bytes == fs::file_size(dir.path / "day_0.ctrb"));
  CHECK_FALSE(fs::exists(dir.path / "day_0.ctrb.partial"));
  const ctr_files files(dir.path / "day_0.ctrb");
  CHECK(files.size() == 5000);
  CHECK(files.chunks() == 17);
  CHECK(files.schema().table_rows == std::vector<std::uint64_t>(26, 5000));
  CHECK(files.schema().hash_seed == 3);
  CHECK(files.schema().key_bytes() == 4);
  CHECK(same_bits(all_examples(files), all_examples(expected)));
  CHECK_NOTHROW(files.verify());
}

TEST_CASE("convert_criteo: bad lines as the streaming reader reports them", "[data][ctr_binary]") {
  strata_test::temp_dir dir("ctrb_bad");
  std::string good = "1";
  for (int j = 0; j < 13; ++j)
    good += "\t5";
  for (int f = 0; f < 26; ++f)
    good += "\tab";
  std::string text;
  for (int i = 0; i < 6; ++i)
    text += good + "\n";
  text += "2" + good.substr(1) + "\n";   // line 7: bad label
  text += std::string(200, 'x') + "\n";  // line 8: longer than max_line_bytes
  text += good;                          // line 9, no final newline
  const auto tsv = dir.write("bad.tsv", text);
  criteo_options options;
  options.table_rows = {100};
  options.max_line_bytes = 150;
  SECTION("refused with file:line, and no file left") {
    const auto e = catch_error(
        [&] { convert_criteo(tsv, dir.path / "bad.ctrb", options, {.block_bytes = 64}); });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "bad.tsv:7: label '2' is not 0 or 1"));
    CHECK_FALSE(fs::exists(dir.path / "bad.ctrb"));
    CHECK_FALSE(fs::exists(dir.path / "bad.ctrb.partial"));
  }
  SECTION("skipped and counted like criteo_reader") {
    options.skip_bad_lines = true;
    criteo_summary streamed;
    const auto expected = load_criteo(tsv, options, &streamed);
    const auto report = convert_criteo(tsv, dir.path / "bad.ctrb", options, {.block_bytes = 64});
    CHECK(report.summary.lines_read == streamed.lines_read);
    CHECK(report.summary.examples == 7);
    CHECK(report.summary.lines_skipped == 2);
    CHECK(report.summary.skipped_by_kind == streamed.skipped_by_kind);
    CHECK(report.summary.first_reasons == streamed.first_reasons);
    CHECK(same_bits(all_examples(ctr_files(dir.path / "bad.ctrb")), all_examples(expected)));
  }
  SECTION("bad arguments") {
    CHECK(catch_error([&] {
            convert_criteo(dir.path / "none.tsv", dir.path / "x.ctrb", options);
          }).code() == errc::io_error);
    CHECK(catch_error([&] {
            convert_criteo(tsv, dir.path / "no" / "such" / "x.ctrb", options);
          }).code() == errc::io_error);
    CHECK(catch_error([&] {
            convert_criteo(tsv, dir.path / "x.ctrb", options, {.chunk_rows = 0});
          }).code() == errc::invalid_argument);
  }
}

TEST_CASE("ctr_files: damaged, mixed and missing files are refused", "[data][ctr_binary]") {
  strata_test::temp_dir dir("ctrb_damage");
  const auto good = write_numbered(dir.path / "day_0.ctrb", 1000, 128);
  const auto copy = [&](const std::string& name) {
    fs::create_directories(dir.path / name);
    fs::copy_file(good, dir.path / name / "day_0.ctrb");
    return dir.path / name / "day_0.ctrb";
  };
  SECTION("a flipped byte in a chunk: verify() and a loader name the chunk") {
    const auto p = copy("chunk");
    flip_byte(p, 4096 + 5000);  // inside the first chunk's dense values
    const ctr_files files(p);
    const auto e = catch_error([&] { files.verify(); });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "fails its checksum"));
    CHECK(contains(e.what(), "examples 0..127"));
    auto loader = files.loader({.world_size = 1, .global_batch = 1000});
    ctr_batch b;
    CHECK(catch_error([&] { loader->load(0, b); }).code() == errc::corrupt_data);
  }
  SECTION("a flipped header byte") {
    const auto p = copy("header");
    flip_byte(p, 20);
    const auto e = catch_error([&] { ctr_files files(p); });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "header fails its checksum"));
  }
  SECTION("truncated") {
    const auto p = copy("truncated");
    fs::resize_file(p, fs::file_size(p) - 10);
    const auto e = catch_error([&] { ctr_files files(p); });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "truncated"));
  }
  SECTION("not a converted file") {
    const auto p = dir.write("x.ctrb", std::string(5000, 'a'));
    CHECK(contains(catch_error([&] { ctr_files files(p); }).what(), "no STRATACB magic"));
    const auto tiny = dir.write("tiny.ctrb", "abc");
    CHECK(contains(catch_error([&] { ctr_files files(tiny); }).what(), "shorter than its header"));
  }
  SECTION("days converted with other hashing") {
    fs::create_directories(dir.path / "mixed");
    write_numbered(dir.path / "mixed" / "day_0.ctrb", 100, 50, 1000);
    write_numbered(dir.path / "mixed" / "day_1.ctrb", 100, 50, 2000);
    const auto e = catch_error([&] { ctr_files files(dir.path / "mixed"); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "another schema or hashing"));
  }
  SECTION("no file, an empty folder") {
    CHECK(catch_error([&] { ctr_files files(dir.path / "none"); }).code() == errc::io_error);
    fs::create_directories(dir.path / "empty");
    CHECK(contains(catch_error([&] { ctr_files files(dir.path / "empty"); }).what(),
                   "holds no .ctrb file"));
  }
  SECTION("keys outside the tables, labels other than 0/1 are refused by the writer") {
    ctr_file_schema schema;
    schema.table_rows = {10};
    ctr_binary_writer w(dir.path / "w.ctrb", schema);
    std::vector<float> dense(13), label{1.0f};
    std::vector<std::uint64_t> keys(26, 3);
    keys[4] = 10;
    CHECK(catch_error([&] { w.append(dense, keys, label); }).code() == errc::out_of_range);
    keys[4] = 0;
    label[0] = 0.5f;
    CHECK(catch_error([&] { w.append(dense, keys, label); }).code() == errc::invalid_argument);
  }
  SECTION("an unfinished writer leaves no file") {
    {
      ctr_file_schema schema;
      schema.table_rows = {10};
      ctr_binary_writer w(dir.path / "gone.ctrb", schema);
    }
    CHECK_FALSE(fs::exists(dir.path / "gone.ctrb"));
    CHECK_FALSE(fs::exists(dir.path / "gone.ctrb.partial"));
  }
}

TEST_CASE("ctr_files: days in natural order, gather across files", "[data][ctr_binary]") {
  strata_test::temp_dir dir("ctrb_days");
  write_numbered(dir.path / "day_10.ctrb", 50, 16, 1000, 200);
  write_numbered(dir.path / "day_2.ctrb", 100, 16, 1000, 100);
  write_numbered(dir.path / "day_0.ctrb", 100, 16, 1000, 0);
  dir.write("notes.txt", "ignored");
  const ctr_files files(dir.path);
  CHECK(files.files() == 3);
  CHECK(files.size() == 250);
  const auto all = all_examples(files);
  for (std::size_t i = 0; i < 250; ++i) {
    REQUIRE(number_of(all, i) == i);
    REQUIRE(all.labels[i] == static_cast<float>(i % 2));
    REQUIRE(all.keys(i, 5) == (i * 31 + 5) % 1000);
  }
  std::vector<std::size_t> bad{3, 250};
  ctr_batch b;
  CHECK(catch_error([&] { files.gather(bad, b); }).code() == errc::out_of_range);
}

TEST_CASE("ctr_files loaders: each epoch a permutation, the same at every worker count",
          "[data][ctr_binary]") {
  strata_test::temp_dir dir("ctrb_loader");
  // 10 000 examples in chunks of 64 (the last partial); windows of 4 chunks.
  write_numbered(dir.path / "a.ctrb", 6000, 64);
  write_numbered(dir.path / "b.ctrb", 4000, 64, 1000, 6000);
  const ctr_files files(dir.path);
  const std::size_t global = 96;
  const auto config = [&](std::size_t world, std::size_t rank, std::size_t shards) {
    return loader_config{.world_size = world,
                         .rank = rank,
                         .global_batch = global,
                         .seed = 11,
                         .data_shards = shards,
                         .shuffle_window = 256};
  };
  // The global batches of `steps` steps from `world` loaders (rank after rank).
  const auto walk = [&](std::size_t world, std::size_t shards, std::size_t first,
                        std::size_t steps) {
    std::vector<std::unique_ptr<batch_loader>> loaders;
    for (std::size_t r = 0; r < world; ++r)
      loaders.push_back(files.loader(config(world, r, shards)));
    std::vector<std::size_t> seen;
    ctr_batch b;
    for (std::size_t s = first; s < first + steps; ++s)
      for (auto& l : loaders) {
        l->load(s, b);
        REQUIRE(b.size() == global / world);
        for (std::size_t i = 0; i < b.size(); ++i)
          seen.push_back(number_of(b, i));
      }
    return seen;
  };
  const std::size_t per_epoch = files.steps_per_epoch(config(4, 0, 4));
  // Smallest shard: ⌊157 / 4⌋ = 39 chunks, the smallest 39 of them (two partial: 48 and 32
  // examples) hold 37 · 64 + 48 + 32 = 2448 → 102 steps of 24.
  CHECK(files.chunks() == 157);
  CHECK(per_epoch == 102);
  SECTION("no example twice in an epoch; the next epoch reorders") {
    const auto e0 = walk(4, 4, 0, per_epoch);
    CHECK(std::set<std::size_t>(e0.begin(), e0.end()).size() == e0.size());
    CHECK(e0.size() == per_epoch * global);
    const auto e1 = walk(4, 4, per_epoch, per_epoch);
    CHECK(e1 != e0);
    CHECK(walk(4, 4, 0, 3) == std::vector<std::size_t>(e0.begin(), e0.begin() + 3 * global));
  }
  SECTION("equal data_shards: the same global batches with 1, 2 and 4 workers") {
    const auto four = walk(4, 4, 0, 20);
    CHECK(walk(2, 4, 0, 20) == four);
    CHECK(walk(1, 4, 0, 20) == four);
    CHECK(walk(1, 2, 0, 20) != four);  // another shard count is another order
  }
  SECTION("rank r reads only its shard's chunks (data_shards = workers)") {
    // Each worker's examples of an epoch come from chunks no other worker touches.
    std::vector<std::set<std::size_t>> chunks_of(4);
    ctr_batch b;
    for (std::size_t r = 0; r < 4; ++r) {
      auto l = files.loader(config(4, r, 0));
      for (std::size_t s = 0; s < per_epoch; ++s) {
        l->load(s, b);
        for (std::size_t i = 0; i < b.size(); ++i)
          chunks_of[r].insert(chunk_id(number_of(b, i)));
      }
    }
    for (std::size_t r = 0; r < 4; ++r)
      for (std::size_t q = r + 1; q < 4; ++q)
        for (const auto c : chunks_of[r])
          CHECK_FALSE(chunks_of[q].contains(c));
  }
  SECTION("windows: the examples of a step come from at most two windows of chunks") {
    auto l = files.loader(config(1, 0, 1));
    ctr_batch b;
    for (std::size_t s = 0; s < 30; ++s) {
      l->load(s, b);
      std::set<std::size_t> chunks;
      for (std::size_t i = 0; i < b.size(); ++i)
        chunks.insert(chunk_id(number_of(b, i)));
      CHECK(chunks.size() <= 8);  // 96 examples from ≤ 2 windows of 4 chunks
    }
  }
  SECTION("bad layouts") {
    CHECK(contains(catch_error([&] { (void)files.steps_per_epoch(config(4, 0, 192)); }).what(),
                   "multiple of the 192 data shards"));
    write_numbered(dir.path / "few" / "few.ctrb", 150, 64);  // 3 chunks
    const ctr_files few(dir.path / "few");
    CHECK(contains(catch_error([&] { (void)few.steps_per_epoch(config(4, 0, 4)); }).what(),
                   "only 3 chunks"));
    CHECK(catch_error([&] { (void)files.loader(config(4, 0, 5)); }).code() ==
          errc::invalid_argument);  // 96 is not a multiple of 5 shards
    CHECK(catch_error([&] { (void)files.loader(config(4, 4, 4)); }).code() ==
          errc::invalid_argument);
  }
}

TEST_CASE("ctr_files: resident memory stays bounded whatever the file size", "[data][ctr_binary]") {
  strata_test::temp_dir dir("ctrb_rss");
  // Examples are 157 bytes: 60 000 ≈ 9.4 MB and 600 000 ≈ 94 MB of file; windows of 8192
  // examples ≈ 1.3 MB.
  const auto small = write_numbered(dir.path / "small.ctrb", 60'000, 1024);
  const auto large = write_numbered(dir.path / "large.ctrb", 600'000, 1024);
  const auto peak_growth = [&](const fs::path& p) {
    const ctr_files files(p);
    auto loader =
        files.loader({.world_size = 1, .global_batch = 512, .seed = 1, .shuffle_window = 8192});
    const std::size_t before = resident_file_bytes();
    std::size_t peak = 0;
    ctr_batch b;
    for (std::size_t s = 0; s < loader->steps_per_epoch(); ++s) {
      loader->load(s, b);
      if (s % 8 == 0) peak = std::max(peak, resident_file_bytes());
    }
    return peak > before ? peak - before : 0;
  };
  const std::size_t growth_small = peak_growth(small), growth_large = peak_growth(large);
  INFO("RssFile growth: " << growth_small << " B (9.4 MB file), " << growth_large
                          << " B (94 MB file)");
  CHECK(growth_large < 6 * (std::size_t{1} << 20));  // about two windows of 1.3 MB
  CHECK(growth_large < growth_small + 2 * (std::size_t{1} << 20));
}

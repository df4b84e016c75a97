// ctr_files streaming Criteo TSV (data::tsv_input): the examples load_criteo reads, in order;
// the batches of the same day converted to .ctrb; bad lines refused or skipped as the reader
// does; resident memory independent of the file's size.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "strata/data/ctr_binary.hpp"
#include "strata/data/synthetic.hpp"

#include "support/catch_error.hpp"
#include "support/ctr_batches.hpp"
#include "support/skip.hpp"
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

fs::path synthetic_day(const fs::path& path, std::size_t rows, std::uint64_t seed,
                       std::size_t first_row = 0) {
  synthetic_criteo gen;
  gen.rows = rows;
  gen.seed = seed;
  gen.first_row = first_row;
  gen.threads = 1;
  write_synthetic_criteo(path, gen);
  return path;
}

/// Resident memory of this process (VmRSS: heap and mapped pages), in bytes.
std::size_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  return 0;
}

}  // namespace

TEST_CASE("streamed TSV: the examples load_criteo reads, in order", "[data][ctr_stream]") {
  strata_test::temp_dir dir("ctr_stream_same");
  const auto a = synthetic_day(dir.path / "day_0.tsv", 3000, 7);
  const auto b = synthetic_day(dir.path / "day_1.tsv", 1000, 7, 3000);
  criteo_options options;
  options.table_rows = {5000};
  options.hash_seed = 3;
  const std::size_t lines = GENERATE(1, 256, 4096);
  const ctr_files streamed(tsv_input{{a, b}, options, lines});
  CHECK(streamed.streamed_tsv());
  CHECK(streamed.size() == 4000);
  CHECK(streamed.chunks() == (3000 + lines - 1) / lines + (1000 + lines - 1) / lines);
  CHECK(streamed.schema().table_rows == std::vector<std::uint64_t>(26, 5000));
  CHECK(streamed.tsv_summary().lines_read == 4000);
  CHECK(streamed.tsv_summary().examples == 4000);
  CHECK(contains(streamed.describe(), "2 TSV file(s) streamed, 4000 examples"));
  ctr_dataset expected = load_criteo(a, options);
  expected.append(all_examples(load_criteo(b, options)));
  CHECK(same_bits(all_examples(streamed), all_examples(expected)));
  CHECK_NOTHROW(streamed.verify());
  // A scattered gather (several chunks per call, out of order).
  const std::vector<std::size_t> picks = {3999, 0, 2999, 3000, 17, 17, 1234};
  ctr_batch got, want;
  streamed.gather(picks, got);
  expected.gather(picks, want);
  CHECK(same_bits(got, want));
}

TEST_CASE("streamed TSV: the batches of the same day converted", "[data][ctr_stream]") {
  strata_test::temp_dir dir("ctr_stream_batches");
  const auto day = synthetic_day(dir.path / "day_0.tsv", 6000, 11);
  criteo_options options;
  options.table_rows = {1000};
  options.hash_seed = 5;
  convert_criteo(day, dir.path / "day_0.ctrb", options, {.chunk_rows = 256});
  const ctr_files converted(dir.path / "day_0.ctrb");
  const ctr_files streamed(tsv_input{{day}, options, 256});
  REQUIRE(streamed.chunks() == converted.chunks());
  for (const std::size_t world : {1, 2}) {
    const loader_config c{.world_size = world,
                          .rank = world - 1,
                          .global_batch = 64,
                          .seed = 9,
                          .data_shards = 2,
                          .shuffle_window = 1024};
    REQUIRE(streamed.steps_per_epoch(c) == converted.steps_per_epoch(c));
    auto from_tsv = streamed.loader(c);
    auto from_ctrb = converted.loader(c);
    ctr_batch x, y;
    // One epoch and the start of the next (the chunk order is dealt again).
    for (std::size_t step = 0; step < from_tsv->steps_per_epoch() + 5; ++step) {
      from_tsv->load(step, x);
      from_ctrb->load(step, y);
      INFO("world " << world << ", step " << step);
      REQUIRE(same_bits(x, y));
    }
    // A loader may start anywhere (a resumed run): the same batch.
    auto late = streamed.loader(c);
    late->load(100, x);
    from_ctrb->load(100, y);
    CHECK(same_bits(x, y));
  }
}

TEST_CASE("streamed TSV: bad lines refused or skipped as the reader does",
          "[data][ctr_stream][errors]") {
  strata_test::temp_dir dir("ctr_stream_bad");
  std::string good = "1";
  for (int j = 0; j < 13; ++j)
    good += "\t5";
  for (int f = 0; f < 26; ++f)
    good += "\tab";
  std::string text;
  for (int i = 0; i < 6; ++i)
    text += good + "\r\n";
  text += "2" + good.substr(1) + "\n";   // line 7: bad label
  text += std::string(200, 'x') + "\n";  // line 8: longer than max_line_bytes
  text += "\n";                          // line 9: empty
  for (int i = 0; i < 3; ++i)
    text += good + "\n";
  text += good;  // line 13, no final newline
  const auto tsv = dir.write("bad.tsv", text);
  criteo_options options;
  options.table_rows = {100};
  options.max_line_bytes = 150;
  SECTION("refused with file:line") {
    const auto e = catch_error([&] { (void)ctr_files(tsv_input{{tsv}, options, 4}); });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "bad.tsv:7: label '2' is not 0 or 1"));
    CHECK(contains(e.what(), "--skip-bad-lines"));
  }
  SECTION("skipped and counted like criteo_reader") {
    options.skip_bad_lines = true;
    criteo_summary read;
    const auto expected = load_criteo(tsv, options, &read);
    const std::size_t lines = GENERATE(1, 3, 4, 100);
    const ctr_files streamed(tsv_input{{tsv}, options, lines});
    CHECK(streamed.size() == 10);
    CHECK(streamed.tsv_summary().lines_read == read.lines_read);
    CHECK(streamed.tsv_summary().lines_skipped == 3);
    CHECK(streamed.tsv_summary().skipped_by_kind == read.skipped_by_kind);
    CHECK(streamed.tsv_summary().first_reasons == read.first_reasons);
    CHECK(same_bits(all_examples(streamed), all_examples(expected)));
    // Chunks whose every line is bad are left out: one line a chunk → 10 chunks.
    if (lines == 1) CHECK(streamed.chunks() == 10);
    auto loader = streamed.loader({.world_size = 1, .global_batch = 2, .seed = 1});
    ctr_batch b;
    std::vector<float> labels;
    for (std::size_t s = 0; s < loader->steps_per_epoch(); ++s) {
      loader->load(s, b);
      labels.insert(labels.end(), b.labels.begin(), b.labels.end());
    }
    CHECK(labels.size() == 10);
  }
  SECTION("bad arguments, a missing file, an empty file") {
    CHECK(catch_error([&] {
            (void)ctr_files(tsv_input{{dir.path / "none.tsv"}, options});
          }).code() == errc::io_error);
    CHECK(catch_error([&] {
            (void)ctr_files(tsv_input{{}, options});
          }).code() == errc::invalid_argument);
    CHECK(catch_error([&] {
            (void)ctr_files(tsv_input{{tsv}, options, 0});
          }).code() == errc::invalid_argument);
    auto zero = options;
    zero.table_rows = {0};
    CHECK(catch_error([&] {
            (void)ctr_files(tsv_input{{tsv}, zero});
          }).code() == errc::invalid_argument);
    const auto empty = dir.write("empty.tsv", "");
    const ctr_files none(tsv_input{{empty}, options});
    CHECK(none.size() == 0);
    CHECK(none.chunks() == 0);
    // Streamed TSV has no key counts (convert it first).
    ctr_key_counts counts(std::vector<std::uint64_t>(26, 100));
    CHECK(catch_error([&] { none.count_keys(counts); }).code() == errc::invalid_argument);
  }
}

TEST_CASE("streamed TSV: resident memory stays bounded whatever the file size",
          "[data][ctr_stream]") {
  // Heap memory under a sanitizer stays resident after it is freed (ASan's quarantine holds
  // up to 256 MB of freed blocks), so VmRSS says nothing there (CI's ASan build: +183 MB).
  if (strata_test::sanitized()) {
    strata_test::skip("VmRSS under a sanitizer: freed memory stays in its quarantine");
    return;
  }
  strata_test::temp_dir dir("ctr_stream_rss");
  // About 255 bytes a line: 20 000 lines ≈ 5 MB, 200 000 ≈ 51 MB; windows of 4096 examples
  // parsed ≈ 1.1 MB.
  const auto small = synthetic_day(dir.path / "small.tsv", 20'000, 3);
  const auto large = synthetic_day(dir.path / "large.tsv", 200'000, 3);
  criteo_options options;
  options.table_rows = {1000};
  const auto peak_growth = [&](const fs::path& p) {
    const std::size_t before = resident_bytes();
    const ctr_files files(tsv_input{{p}, options, 512});
    auto loader =
        files.loader({.world_size = 1, .global_batch = 512, .seed = 1, .shuffle_window = 4096});
    std::size_t peak = resident_bytes();
    ctr_batch b;
    for (std::size_t s = 0; s < loader->steps_per_epoch(); ++s) {
      loader->load(s, b);
      if (s % 4 == 0) peak = std::max(peak, resident_bytes());
    }
    return peak > before ? peak - before : 0;
  };
  (void)peak_growth(small);  // warms the allocator's pools
  const std::size_t growth_small = peak_growth(small), growth_large = peak_growth(large);
  INFO("VmRSS growth: " << growth_small << " B (5 MB file), " << growth_large << " B (51 MB file)");
  CHECK(growth_large < 16 * (std::size_t{1} << 20));
  CHECK(growth_large < growth_small + 6 * (std::size_t{1} << 20));
}

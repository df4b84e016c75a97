#include <catch2/catch.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/core/timer.hpp"
#include "strata/data/criteo.hpp"
#include "strata/data/synthetic.hpp"

#include "support/temp_dir.hpp"

using namespace strata;
using namespace strata::data;
namespace fs = std::filesystem;

namespace {

fs::path fixture(const std::string& name) {
  const char* dir = std::getenv("STRATA_TEST_FIXTURES");
  return fs::path(dir != nullptr ? dir : "tests/fixtures") / name;
}

/// A well-formed line with label y, dense value d in every integer column and id `id` everywhere.
std::string good_line(int y = 1, const std::string& d = "3", const std::string& id = "abc") {
  std::string s = std::to_string(y);
  for (int j = 0; j < 13; ++j)
    s += "\t" + d;
  for (int f = 0; f < 26; ++f)
    s += "\t" + id;
  return s;
}

/// Replaces field `index` (0 = label) of a tab-separated line.
std::string with_field(std::string line, std::size_t index, const std::string& value) {
  std::size_t begin = 0;
  for (std::size_t i = 0; i < index; ++i)
    begin = line.find('\t', begin) + 1;
  const std::size_t end = std::min(line.find('\t', begin), line.size());
  return line.replace(begin, end - begin, value);
}

std::size_t read_all(criteo_reader& reader, std::size_t batch, ctr_dataset* into = nullptr) {
  ctr_batch b;
  std::size_t n = 0, got = 0;
  while ((got = reader.next(b, batch)) > 0) {
    REQUIRE(got <= batch);
    REQUIRE(b.size() == got);
    if (into != nullptr) into->append(b);
    n += got;
  }
  return n;
}

}  // namespace

TEST_CASE("golden file: dense log1p, missing values, hashed keys, CRLF and no final newline",
          "[data][criteo]") {
  const std::uint64_t rows = 1000;
  criteo_summary summary;
  const auto ds = load_criteo(fixture("criteo_small.tsv"), {.table_rows = {rows}}, &summary);
  REQUIRE(ds.size() == 4);
  REQUIRE(summary.lines_read == 4);
  REQUIRE(summary.examples == 4);
  REQUIRE(summary.lines_skipped == 0);

  // Labels: 1, 0, 0, 0 (line 4 is line 1 with label 0).
  REQUIRE(std::vector<float>(ds.labels().begin(), ds.labels().end()) ==
          std::vector<float>{1, 0, 0, 0});

  // Line 1 integers: 0 1 2 3 _ 7 -1 10 255 0 _ 100 1 → log(1 + max(x, 0)), missing → 0.
  const double expected[13] = {0.0,
                               0.69314718,
                               1.09861229,
                               1.38629436,
                               0.0,
                               2.07944154,
                               0.0 /* -1 clamps to 0 */,
                               2.39789527,
                               5.54517744,
                               0.0,
                               0.0,
                               4.61512052,
                               0.69314718};
  for (std::size_t j = 0; j < 13; ++j) {
    CAPTURE(j);
    REQUIRE(ds.dense()(0, j) == Approx(expected[j]).margin(1e-6));
    REQUIRE(ds.dense()(3, j) == ds.dense()(0, j));
    REQUIRE(ds.dense()(1, j) == 0.0f);  // all missing
  }
  // Line 3: I13 = 2^63 − 1 → log(2^63) = 63 ln 2.
  REQUIRE(ds.dense()(2, 12) == Approx(43.66827237527655).epsilon(1e-7));

  // Keys: in range, the documented hash, case-insensitive hex, missing → fixed key per feature.
  for (std::size_t i = 0; i < ds.size(); ++i)
    for (std::size_t f = 0; f < 26; ++f)
      REQUIRE(ds.keys()(i, f) < rows);
  REQUIRE(ds.keys()(0, 0) == criteo_key(0, 0x68fd1e64, rows));
  REQUIRE(ds.keys()(2, 0) == ds.keys()(0, 0));  // "68FD1E64" == "68fd1e64"
  REQUIRE(ds.keys()(0, 25) == criteo_key(25, 0x9727dd16, rows));
  REQUIRE(ds.keys()(2, 1) == criteo_key(1, 0xffffffffffffffffull, rows));
  REQUIRE(ds.keys()(2, 2) == criteo_key(2, 0, rows));
  for (std::size_t f = 0; f < 26; ++f)
    REQUIRE(ds.keys()(1, f) == criteo_missing_key(f, rows));
  REQUIRE(ds.keys()(0, 21) == criteo_missing_key(21, rows));  // C22 empty on line 1
  REQUIRE(ds.keys()(2, 3) == criteo_missing_key(3, rows));
  // Same raw value in different features hashes differently (feature index is mixed in).
  REQUIRE(ds.keys()(2, 4) != ds.keys()(2, 5));
  // Regression pins: the hash is part of the on-disk meaning of trained tables.
  REQUIRE(criteo_key(0, 0x68fd1e64, std::uint64_t{1} << 63) ==
          (mix_ids(mix_ids(0, 1), 0x68fd1e64) & ((std::uint64_t{1} << 63) - 1)));
  REQUIRE(mix_ids(mix_ids(0, 1), 0x68fd1e64) % rows == ds.keys()(0, 0));
}

TEST_CASE("per-feature table sizes and hash seed", "[data][criteo]") {
  std::vector<std::uint64_t> rows(26);
  for (std::size_t f = 0; f < 26; ++f)
    rows[f] = 2 + f;
  const auto ds = load_criteo(fixture("criteo_small.tsv"), {.table_rows = rows});
  for (std::size_t f = 0; f < 26; ++f) {
    REQUIRE(ds.keys()(0, f) < rows[f]);
    REQUIRE(ds.keys()(1, f) == criteo_missing_key(f, rows[f]));
  }
  const auto seeded =
      load_criteo(fixture("criteo_small.tsv"), {.table_rows = {1u << 30}, .hash_seed = 7});
  REQUIRE(seeded.keys()(0, 0) == criteo_key(0, 0x68fd1e64, 1u << 30, 7));
  REQUIRE(seeded.keys()(0, 0) != criteo_key(0, 0x68fd1e64, 1u << 30, 0));
}

TEST_CASE("bad options and a missing file are rejected", "[data][criteo]") {
  REQUIRE_THROWS_WITH(criteo_reader(fixture("criteo_small.tsv"), {.table_rows = {1, 2}}),
                      Catch::Contains("1 or 26"));
  REQUIRE_THROWS_WITH(criteo_reader(fixture("criteo_small.tsv"), {.table_rows = {0}}),
                      Catch::Contains("table_rows[0] is 0"));
  REQUIRE_THROWS_WITH(criteo_reader(fixture("criteo_small.tsv"), {.chunk_rows = 0}),
                      Catch::Contains("chunk_rows"));
  try {
    criteo_reader r("/nonexistent/strata/day_0.tsv");
    FAIL("no exception");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::io_error);
    REQUIRE_THAT(e.what(), Catch::Contains("/nonexistent/strata/day_0.tsv"));
  }
  criteo_reader r(fixture("criteo_small.tsv"));
  ctr_batch b;
  REQUIRE_THROWS_WITH(r.next(b, 0), Catch::Contains("batch_size"));
}

TEST_CASE("every kind of malformed line raises corrupt_data with file:line, or is skipped",
          "[data][criteo]") {
  const std::string good = good_line();
  struct bad_case {
    std::string line;
    bad_line_kind kind;
    std::string says;
  };
  std::string with_extra = good + "\tff";
  std::string missing_one = good.substr(0, good.rfind('\t'));
  const std::vector<bad_case> cases = {
      {missing_one, bad_line_kind::column_count, "found 39"},
      {with_extra, bad_line_kind::column_count, "found 41"},
      {"", bad_line_kind::column_count, "found 1"},
      {with_field(good, 0, "2"), bad_line_kind::bad_label, "label '2'"},
      {with_field(good, 0, ""), bad_line_kind::bad_label, "label ''"},
      {with_field(good, 0, "1.0"), bad_line_kind::bad_label, "label '1.0'"},
      {with_field(good, 3, "12a"), bad_line_kind::bad_integer, "I3 = '12a'"},
      {with_field(good, 1, "1.5"), bad_line_kind::bad_integer, "I1 = '1.5'"},
      {with_field(good, 13, "+4"), bad_line_kind::bad_integer, "I13 = '+4'"},
      {with_field(good, 2, "99999999999999999999"), bad_line_kind::bad_integer, "I2"},
      {with_field(good, 14, "xyz1"), bad_line_kind::bad_hex, "C1 = 'xyz1'"},
      {with_field(good, 20, "0x12"), bad_line_kind::bad_hex, "C7 = '0x12'"},
      {with_field(good, 39, "1ffffffffffffffff"), bad_line_kind::bad_hex, "C26"},
      {with_field(good, 30, "-1"), bad_line_kind::bad_hex, "C17"},
      {good + std::string(300, '7'), bad_line_kind::overlong, "longer than max_line_bytes = 256"},
  };
  const strata_test::temp_dir dir("criteo");
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const auto& bc = cases[c];
    CAPTURE(c, bc.says);
    // Bad line is line 3, between good lines.
    const auto path = dir.write("bad" + std::to_string(c) + ".tsv",
                                good + "\n" + good + "\n" + bc.line + "\n" + good + "\n");
    {
      criteo_reader reader(path, {.max_line_bytes = 256});
      ctr_batch b;
      REQUIRE(reader.next(b, 2) == 2);  // the lines before the bad one are delivered
      try {
        reader.next(b, 2);
        FAIL("no exception");
      } catch (const error& e) {
        REQUIRE(e.code() == errc::corrupt_data);
        REQUIRE_THAT(e.what(), Catch::Contains(path.string() + ":3: ") &&
                                   Catch::Contains(bc.says) &&
                                   Catch::Contains(std::string(to_string(bc.kind))));
      }
      REQUIRE_THROWS_AS(reader.next(b, 2), error);  // stays failed
    }
    {
      criteo_summary s;
      const auto ds = load_criteo(path, {.skip_bad_lines = true, .max_line_bytes = 256}, &s);
      REQUIRE(ds.size() == 3);
      REQUIRE(s.lines_read == 4);
      REQUIRE(s.examples == 3);
      REQUIRE(s.lines_skipped == 1);
      REQUIRE(s.skipped_by_kind[static_cast<std::size_t>(bc.kind)] == 1);
      REQUIRE(s.first_reasons.size() == 1);
      REQUIRE_THAT(s.first_reasons[0], Catch::Contains(path.string() + ":3: "));
      REQUIRE_THAT(s.to_string(), Catch::Contains("1 skipped") &&
                                      Catch::Contains(std::string(to_string(bc.kind))));
    }
  }
}

TEST_CASE("skip mode counts many bad lines and keeps only the first few reasons",
          "[data][criteo]") {
  const strata_test::temp_dir dir("criteo");
  std::string text;
  for (int i = 0; i < 100; ++i)
    text += (i % 3 == 0 ? with_field(good_line(), 0, "7") : good_line(i % 2)) + "\n";
  text += std::string(5000, 'x') + "\n";       // overlong, within the read buffer
  text += std::string(2'500'000, 'y') + "\n";  // overlong, larger than the read buffer
  text += good_line() + "\n";
  const auto path = dir.write("many.tsv", text);
  criteo_reader reader(path, {.skip_bad_lines = true,
                              .chunk_rows = 8,
                              .prefetch_chunks = 2,
                              .max_line_bytes = 1000,
                              .max_reasons = 3});
  ctr_dataset ds;
  REQUIRE(read_all(reader, 5, &ds) == 100 - 34 + 1);
  const auto s = reader.summary();
  REQUIRE(s.lines_read == 103);
  REQUIRE(s.lines_skipped == 36);
  REQUIRE(s.skipped_by_kind[static_cast<std::size_t>(bad_line_kind::bad_label)] == 34);
  REQUIRE(s.skipped_by_kind[static_cast<std::size_t>(bad_line_kind::overlong)] == 2);
  REQUIRE(s.first_reasons.size() == 3);
  REQUIRE_THAT(s.first_reasons[1], Catch::Contains(":4: label '7'"));
}

TEST_CASE("streaming a file much larger than the prefetch queue gives the same examples",
          "[data][criteo]") {
  const strata_test::temp_dir dir("criteo");
  const auto path = dir.path / "gen.tsv";
  write_synthetic_criteo(path, {.rows = 5003, .seed = 3, .threads = 1});
  const auto reference = load_criteo(path);  // default chunking
  REQUIRE(reference.size() == 5003);

  for (std::size_t batch : {1, 100, 64, 7000}) {
    CAPTURE(batch);
    criteo_reader reader(path, {.chunk_rows = 64, .prefetch_chunks = 2});
    ctr_dataset ds;
    REQUIRE(read_all(reader, batch, &ds) == 5003);
    const auto s = reader.summary();
    REQUIRE(s.examples == 5003);
    REQUIRE(s.peak_queued_chunks >= 1);
    REQUIRE(s.peak_queued_chunks <= 2);  // the queue stays bounded
    REQUIRE(std::equal(ds.labels().begin(), ds.labels().end(), reference.labels().begin()));
    REQUIRE(std::equal(ds.dense().flat().begin(), ds.dense().flat().end(),
                       reference.dense().flat().begin()));
    REQUIRE(std::equal(ds.keys().flat().begin(), ds.keys().flat().end(),
                       reference.keys().flat().begin()));
    ctr_batch b;
    REQUIRE(reader.next(b, 10) == 0);  // stays at the end
    REQUIRE(!reader.next(10).has_value());
  }
  // The optional-returning form.
  criteo_reader reader(path, {.chunk_rows = 64, .prefetch_chunks = 2});
  auto first = reader.next(5000);
  REQUIRE(first.has_value());
  REQUIRE(first->size() == 5000);
  auto rest = reader.next(5000);
  REQUIRE(rest.has_value());
  REQUIRE(rest->size() == 3);
  REQUIRE(rest->labels[2] == reference.labels()[5002]);
  REQUIRE(!reader.next(5000));
}

TEST_CASE("an error deep in the file surfaces in the consumer after the good examples",
          "[data][criteo]") {
  const strata_test::temp_dir dir("criteo");
  std::string text;
  for (int i = 0; i < 3000; ++i)
    text += good_line(i % 2) + "\n";
  text += with_field(good_line(), 5, "five") + "\n" + good_line() + "\n";
  const auto path = dir.write("deep.tsv", text);
  criteo_reader reader(path, {.chunk_rows = 64, .prefetch_chunks = 2});
  ctr_batch b;
  std::size_t delivered = 0;
  try {
    for (;;) {
      const std::size_t n = reader.next(b, 50);
      REQUIRE(n > 0);
      delivered += n;
    }
  } catch (const error& e) {
    REQUIRE(e.code() == errc::corrupt_data);
    REQUIRE_THAT(e.what(),
                 Catch::Contains(path.string() + ":3001:") && Catch::Contains("I5 = 'five'"));
  }
  REQUIRE(delivered == 3000);
}

TEST_CASE("destroying a reader with unread data does not hang", "[data][criteo]") {
  const strata_test::temp_dir dir("criteo");
  std::string text;
  for (int i = 0; i < 20000; ++i)
    text += good_line(i % 2) + "\n";
  const auto path = dir.write("big.tsv", text);
  stopwatch watch;
  {
    criteo_reader reader(path, {.chunk_rows = 16, .prefetch_chunks = 1});
    ctr_batch b;
    REQUIRE(reader.next(b, 10) == 10);
  }
  { criteo_reader untouched(path, {.chunk_rows = 16, .prefetch_chunks = 1}); }
  {  // parser blocked on a full queue while an error is pending later in the file
    criteo_reader reader(path, {.chunk_rows = 1, .prefetch_chunks = 1});
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  REQUIRE(watch.seconds() < 5);
}

TEST_CASE("an empty file has no examples", "[data][criteo]") {
  const strata_test::temp_dir dir("criteo");
  const auto path = dir.write("empty.tsv", "");
  criteo_reader reader(path);
  REQUIRE(!reader.next(16).has_value());
  REQUIRE(reader.summary().lines_read == 0);
}

TEST_CASE("the parser's fast paths agree with their references", "[data][criteo]") {
  SECTION("fast_modulo equals % for every kind of divisor") {
    const counter_rng rng{42, 0};
    std::vector<std::uint64_t> divisors = {1,
                                           2,
                                           3,
                                           7,
                                           1000,
                                           200'000,
                                           (1u << 20),
                                           4294967291ull,
                                           (std::uint64_t{1} << 32) + 15,
                                           (std::uint64_t{1} << 63),
                                           ~std::uint64_t{0},
                                           ~std::uint64_t{0} - 1};
    for (std::uint64_t i = 0; i < 50; ++i)
      divisors.push_back(rng.bits(i) >> (i % 60) | 1);
    for (const auto d : divisors) {
      const data::detail::fast_modulo mod(d);
      for (std::uint64_t a : {std::uint64_t{0}, std::uint64_t{1}, d - 1, d, d + 1,
                              ~std::uint64_t{0}, ~std::uint64_t{0} - d})
        REQUIRE(mod(a) == a % d);
      for (std::uint64_t i = 0; i < 2000; ++i) {
        const std::uint64_t a = rng.bits(1000 + i);
        REQUIRE(mod(a) == a % d);
      }
    }
  }
  SECTION("criteo_hashing equals criteo_key / criteo_missing_key") {
    const std::vector<std::uint64_t> rows = {5, 200'000, std::uint64_t{1} << 40};
    for (const auto r : rows) {
      const criteo_hashing h(std::span(&r, 1), 9);
      for (std::size_t f = 0; f < criteo_sparse_columns; ++f) {
        REQUIRE(h.missing_key(f) == criteo_missing_key(f, r, 9));
        for (std::uint64_t v : {0ull, 1ull, 0x68fd1e64ull, 0xffffffffffffffffull})
          REQUIRE(h.key(f, v) == criteo_key(f, v, r, 9));
      }
    }
  }
  SECTION("parse_hex64 accepts exactly what from_chars base 16 accepts") {
    const std::vector<std::string> cases = {"0",
                                            "f",
                                            "F",
                                            "68fd1e64",
                                            "68FD1E64",
                                            "00000000",
                                            "ffffffff",
                                            "FFFFFFFF",
                                            "abcdefAB",
                                            "0123456789abcdef",
                                            "ffffffffffffffff",
                                            "12345678g",
                                            "1234567g",
                                            "g1234567",
                                            "1234 567",
                                            "-1234567",
                                            "+1234567",
                                            "0x123456",
                                            "12345678",
                                            "1234567",
                                            "123456789",
                                            "",
                                            "10000000000000000",
                                            "12\t45678",
                                            "1234567:",
                                            "@ABCDEFG",
                                            "`abcdefg",
                                            "/0123456",
                                            "12345\x80"
                                            "67",
                                            "1234567\xff"};
    for (const auto& s : cases) {
      std::uint64_t expected = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), expected, 16);
      const bool reference =
          !s.empty() && s.size() <= 16 && ec == std::errc{} && end == s.data() + s.size();
      std::uint64_t got = 0;
      INFO("'" << s << "'");
      REQUIRE(data::detail::parse_hex64(s, got) == reference);
      if (reference) REQUIRE(got == expected);
    }
    // Every single byte in every position of an 8-digit id.
    for (int pos = 0; pos < 8; ++pos)
      for (int c = 0; c < 256; ++c) {
        std::string s = "9a8B7c6D";
        s[static_cast<std::size_t>(pos)] = static_cast<char>(c);
        std::uint64_t expected = 0, got = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + 8, expected, 16);
        const bool reference = ec == std::errc{} && end == s.data() + 8;
        REQUIRE(data::detail::parse_hex64(s, got) == reference);
        if (reference) REQUIRE(got == expected);
      }
  }
  SECTION("split_tabs finds every field at every alignment") {
    std::array<data::detail::field_span, data::detail::criteo_fields> spans{};
    for (std::size_t len = 0; len < 40; ++len) {
      std::string line;
      for (std::size_t i = 0; i < len; ++i)
        line += (i * 7 % 5 == 0) ? '\t' : static_cast<char>('a' + i % 26);
      const std::size_t n = data::detail::split_tabs(line, spans);
      REQUIRE(n == static_cast<std::size_t>(std::count(line.begin(), line.end(), '\t')) + 1);
      std::size_t start = 0;
      for (std::size_t k = 0; k < std::min(n, data::detail::criteo_fields); ++k) {
        const std::size_t tab = std::min(line.find('\t', start), line.size());
        REQUIRE(spans[k].begin == start);
        REQUIRE(spans[k].size == tab - start);
        start = tab + 1;
      }
    }
  }
}

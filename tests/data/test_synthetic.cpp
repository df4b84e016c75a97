#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>

#include "strata/data/criteo.hpp"
#include "strata/data/synthetic.hpp"

#include "support/temp_dir.hpp"

using namespace strata;
using namespace strata::data;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

}  // namespace

TEST_CASE("same seed gives the same bytes whatever the thread count; another seed differs",
          "[data][synthetic]") {
  const strata_test::temp_dir dir("synth");
  const synthetic_criteo cfg{.rows = 3000, .seed = 11, .threads = 1};
  auto cfg2 = cfg;
  cfg2.threads = 2;
  auto cfg3 = cfg;
  cfg3.seed = 12;
  const auto r1 = write_synthetic_criteo(dir.path / "a.tsv", cfg);
  const auto r2 = write_synthetic_criteo(dir.path / "b.tsv", cfg2);
  const auto r3 = write_synthetic_criteo(dir.path / "c.tsv", cfg3);
  const auto a = slurp(dir.path / "a.tsv");
  REQUIRE(a.size() == r1.bytes);
  REQUIRE(a == slurp(dir.path / "b.tsv"));
  REQUIRE(a != slurp(dir.path / "c.tsv"));
  REQUIRE(r1.teacher_auc == r2.teacher_auc);
  REQUIRE(r1.positives == r2.positives);
  REQUIRE(r1.bias == r2.bias);
  REQUIRE(r3.rows == 3000);
}

TEST_CASE("generated file reads back cleanly: labels, missing fields, negatives, Zipf ids",
          "[data][synthetic]") {
  const strata_test::temp_dir dir("synth");
  const auto path = dir.path / "train.tsv";
  const synthetic_criteo cfg{.rows = 20000, .seed = 5, .distinct_ids = {1000}};
  const auto report = write_synthetic_criteo(path, cfg);
  INFO("teacher AUC " << report.teacher_auc << ", positive rate " << report.positive_rate
                      << ", logloss " << report.teacher_logloss << ", bias " << report.bias);
  REQUIRE(report.rows == 20000);
  REQUIRE(report.positive_rate > 0.22);
  REQUIRE(report.positive_rate < 0.28);
  REQUIRE(report.teacher_auc > 0.7);
  REQUIRE(report.teacher_auc < 0.92);
  REQUIRE(report.teacher_logloss < 0.56);  // better than the constant predictor (~0.562 at 25%)

  criteo_summary summary;
  const auto ds = load_criteo(path, {.table_rows = {std::uint64_t{1} << 40}}, &summary);
  REQUIRE(ds.size() == 20000);
  REQUIRE(summary.lines_skipped == 0);
  double positives = 0;
  for (float y : ds.labels())
    positives += y;
  REQUIRE(static_cast<std::size_t>(positives) == report.positives);

  // Raw text: missing fields at roughly the configured rates; I2 has some negatives; hex ids.
  std::ifstream in(path);
  std::string line;
  std::size_t empty_dense = 0, empty_sparse = 0, negative = 0, lines = 0, bad_hex = 0;
  std::size_t c1_top = 0;
  std::map<std::string, std::size_t> c1_counts;
  while (std::getline(in, line)) {
    ++lines;
    std::vector<std::string> f;
    std::size_t pos = 0;
    for (;;) {
      const auto tab = line.find('\t', pos);
      f.push_back(line.substr(pos, tab == std::string::npos ? tab : tab - pos));
      if (tab == std::string::npos) break;
      pos = tab + 1;
    }
    if (f.size() != 40) FAIL("line " << lines << " has " << f.size() << " fields");
    for (int j = 1; j <= 13; ++j)
      empty_dense += f[j].empty() ? 1 : 0;
    for (int j = 14; j < 40; ++j) {
      empty_sparse += f[j].empty() ? 1 : 0;
      bad_hex += !f[j].empty() && f[j].size() != 8 ? 1 : 0;
    }
    negative += !f[2].empty() && f[2][0] == '-' ? 1 : 0;
    if (!f[14].empty()) ++c1_counts[f[14]];
  }
  REQUIRE(lines == 20000);
  REQUIRE(bad_hex == 0);  // every id is 8 hex digits
  const double dense_rate = static_cast<double>(empty_dense) / (20000.0 * 13);
  const double sparse_rate = static_cast<double>(empty_sparse) / (20000.0 * 26);
  REQUIRE(dense_rate == Approx(cfg.dense_missing_rate).margin(0.005));
  REQUIRE(sparse_rate == Approx(cfg.sparse_missing_rate).margin(0.005));
  REQUIRE(negative > 100);
  // Zipf(1000, 1.1): the top id takes ~ 1 / H(1000, 1.1) ≈ 17% of draws, at most 1000 ids.
  for (const auto& [id, count] : c1_counts)
    c1_top = std::max(c1_top, count);
  REQUIRE(c1_counts.size() <= 1000);
  REQUIRE(c1_counts.size() > 300);
  REQUIRE(static_cast<double>(c1_top) / 20000.0 > 0.12);
  REQUIRE(static_cast<double>(c1_top) / 20000.0 < 0.22);
}

TEST_CASE("zipf sampler matches the Zipf probabilities", "[data][synthetic]") {
  const std::uint64_t n = 50;
  const double s = 1.1;
  const data::detail::zipf_sampler zipf(n, s);
  const counter_rng rng{3, 0};
  std::vector<double> counts(n + 1, 0);
  const std::size_t draws = 200000;
  std::size_t outside = 0;
  for (std::size_t i = 0; i < draws; ++i) {
    const auto k = zipf.sample(rng, 64 * i);
    if (k < 1 || k > n) {
      ++outside;
      continue;
    }
    counts[k] += 1;
  }
  REQUIRE(outside == 0);
  double h = 0;
  for (std::uint64_t k = 1; k <= n; ++k)
    h += std::pow(static_cast<double>(k), -s);
  for (std::uint64_t k : {1u, 2u, 3u, 10u, 50u}) {
    const double p = std::pow(static_cast<double>(k), -s) / h;
    const double sd = std::sqrt(p * (1 - p) / draws);
    CAPTURE(k, p, counts[k] / draws);
    REQUIRE(std::abs(counts[k] / draws - p) < 5 * sd);
  }
}

TEST_CASE("bad generator configurations are rejected", "[data][synthetic]") {
  const strata_test::temp_dir dir("synth");
  REQUIRE_THROWS_WITH(write_synthetic_criteo(dir.path / "x.tsv", {.rows = 0}),
                      Catch::Contains("rows"));
  REQUIRE_THROWS_WITH(write_synthetic_criteo(dir.path / "x.tsv", {.distinct_ids = {1, 2}}),
                      Catch::Contains("1 or 26"));
  REQUIRE_THROWS_WITH(write_synthetic_criteo(dir.path / "x.tsv", {.target_ctr = 1.5}),
                      Catch::Contains("target_ctr"));
  try {
    write_synthetic_criteo("/nonexistent/dir/x.tsv", {.rows = 10});
    FAIL("no exception");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::io_error);
    REQUIRE_THAT(e.what(), Catch::Contains("/nonexistent/dir/x.tsv"));
  }
}

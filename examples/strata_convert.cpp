// strata_convert: converts Criteo-format TSV days into strata's binary training files
// (data/ctr_binary.hpp: chunked, columnar, checksummed, read by memory mapping), once; then
// `ctr_train --data DIR` trains from them with bounded memory.
//
//   strata_convert --out data day_0.tsv day_1.tsv ...        # data/day_0.ctrb, data/day_1.ctrb
//   strata_convert --out data --table-rows 1000000 --seed 1 --skip-bad-lines day_*.tsv
//   strata_convert --out train --min-count 4 day_0.tsv ... day_22.tsv  # + train/vocabulary.ctrv
//   strata_convert --out eval --vocabulary train/vocabulary.ctrv day_23.tsv  # read alike
//   strata_convert --make-synthetic 200000 day_0.tsv day_1.tsv   # Criteo-format TSV days from
//                                                                # the project's generator
//
// The hashing (--table-rows, --seed) is fixed here and recorded in every file: ctr_train takes
// the tables' rows from the files, and refuses days converted with different hashing.
// --min-count N counts the keys of the days of this call and keeps, per table, those seen at
// least N times (frequency thresholding, data/ctr_vocabulary.hpp): every .ctrb file of the
// folder is then read through DIR/vocabulary.ctrv — rare and unseen ids share one row.
// --vocabulary FILE copies a vocabulary into DIR, so eval days are read as the training days.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "strata/core/cli.hpp"
#include "strata/core/error.hpp"
#include "strata/data/ctr_binary.hpp"
#include "strata/data/synthetic.hpp"

namespace {

using namespace strata;

struct flags {
  std::filesystem::path out;
  std::vector<std::filesystem::path> inputs;
  std::uint64_t table_rows = 200'000;
  std::uint64_t seed = 1;
  std::size_t chunk_rows = 4096;
  std::size_t threads = 0;
  bool skip_bad_lines = false;
  bool overwrite = false;
  std::size_t make_synthetic = 0;  ///< > 0: write synthetic TSV days of this many rows instead
  std::uint64_t distinct_ids = 100'000;
  std::uint64_t min_count = 0;       ///< > 0: count this call's days into DIR/vocabulary.ctrv
  std::filesystem::path vocabulary;  ///< copied into DIR: its days are read through it
};

[[noreturn]] void usage(int code) {
  std::printf(
      "usage: strata_convert --out DIR [flags] DAY.tsv [DAY.tsv ...]\n"
      "       strata_convert --make-synthetic ROWS [--seed S] [--distinct-ids K] DAY.tsv ...\n"
      "  --make-synthetic ROWS   write each named TSV day (ROWS rows each: day d holds rows\n"
      "                      [d x ROWS, (d+1) x ROWS) of one hidden teacher's stream, seed S)\n"
      "                      with the project's generator (data/synthetic.hpp), then stop\n"
      "  --distinct-ids K    synthetic: ids per categorical feature (default 100000)\n"
      "  writes DIR/<day>.ctrb for each TSV (label, 13 integers, 26 hex categoricals)\n"
      "  --table-rows N      rows of every embedding table: keys are hashed into [0, N)\n"
      "                      (default 200000, ctr_train's)\n"
      "  --seed S            hashing seed (default 1: the keys ctr_train --data FILE.tsv\n"
      "                      makes with its default --seed)\n"
      "  --chunk-rows R      examples per chunk, the unit of the per-epoch shuffle and of\n"
      "                      the data shards (default 4096)\n"
      "  --skip-bad-lines    skip and count malformed lines (default: stop at the first, naming\n"
      "                      file:line; no file is left)\n"
      "  --threads T         parser tasks (default: every core)\n"
      "  --min-count N       frequency thresholding: count the keys of the days of this call\n"
      "                      and keep, per table, those seen at least N times (MLPerf DLRM's\n"
      "                      rare-id cut-off); written to DIR/vocabulary.ctrv, through which\n"
      "                      every .ctrb file of DIR is then read (rare and unseen ids share\n"
      "                      a table's last row)\n"
      "  --vocabulary FILE   read the days of DIR through FILE (a vocabulary.ctrv written by\n"
      "                      --min-count): copied into DIR. Convert eval days this way, into\n"
      "                      their own folder, so they map ids as the training days\n"
      "  --overwrite         replace existing .ctrb files (and, with --min-count, DIR's\n"
      "                      vocabulary)\n");
  std::exit(code);
}

flags parse(int argc, char** argv) {
  flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    const auto value = [&] { return cli::flag_value(argc, argv, i); };
    if (a == "--help" || a == "-h")
      usage(0);
    else if (a == "--out")
      f.out = value();
    else if (a == "--table-rows")
      f.table_rows = cli::parse_integer<std::uint64_t>(a, value(), 1, std::uint64_t{1} << 40);
    else if (a == "--seed")
      f.seed = cli::parse_integer<std::uint64_t>(a, value(), 0,
                                                 std::numeric_limits<std::uint64_t>::max());
    else if (a == "--chunk-rows")
      f.chunk_rows = cli::parse_integer<std::size_t>(a, value(), 1, std::size_t{1} << 24);
    else if (a == "--threads")
      f.threads = cli::parse_integer<std::size_t>(a, value(), 1, 1024);
    else if (a == "--skip-bad-lines")
      f.skip_bad_lines = true;
    else if (a == "--overwrite")
      f.overwrite = true;
    else if (a == "--vocabulary")
      f.vocabulary = value();
    else if (a == "--min-count")
      f.min_count = cli::parse_integer<std::uint64_t>(a, value(), 1, std::uint64_t{1} << 62);
    else if (a == "--make-synthetic")
      f.make_synthetic = cli::parse_integer<std::size_t>(a, value(), 1, std::size_t{1} << 34);
    else if (a == "--distinct-ids")
      f.distinct_ids = cli::parse_integer<std::uint64_t>(a, value(), 1, std::uint64_t{1} << 40);
    else if (a.starts_with("-"))
      fail(errc::invalid_argument, cat("unknown flag ", a, "; see --help"));
    else
      f.inputs.emplace_back(a);
  }
  STRATA_EXPECTS(!f.inputs.empty(), "no TSV file given; see --help");
  if (f.make_synthetic > 0) {
    STRATA_EXPECTS(f.out.empty(),
                   "--make-synthetic writes TSV days: drop --out (convert them "
                   "in a second call)");
    for (const auto& in : f.inputs)
      STRATA_EXPECTS(f.overwrite || !std::filesystem::exists(in), "'", in.string(),
                     "' exists; pass --overwrite to replace it");
    return f;
  }
  STRATA_EXPECTS(!f.out.empty(), "--out DIR is required (the folder the .ctrb files go to)");
  STRATA_EXPECTS(f.min_count == 0 || f.vocabulary.empty(),
                 "--min-count counts a new vocabulary and --vocabulary copies one: give one");
  const auto vocabulary = f.out / std::string(data::ctr_vocabulary_name);
  const bool exists = std::filesystem::exists(vocabulary);
  STRATA_EXPECTS(!exists || f.overwrite || (f.min_count == 0 && f.vocabulary.empty()), "'",
                 vocabulary.string(),
                 "' exists: the days of that folder are read through it, and another would move "
                 "every key's row; pass --overwrite to replace it, or convert into a new folder");
  // The vocabulary these days will be read through (copied or already there) must map their
  // hashing.
  const auto given = !f.vocabulary.empty()        ? f.vocabulary
                     : exists && f.min_count == 0 ? vocabulary
                                                  : std::filesystem::path();
  if (!given.empty()) {
    const auto v = data::ctr_vocabulary::load(given);
    bool same = v.hash_seed() == f.seed && v.tables() == data::criteo_sparse_columns;
    for (std::size_t c = 0; same && c < v.tables(); ++c)
      same = v.hash_rows(c) == f.table_rows;
    STRATA_EXPECTS(same, "'", given.string(), "' was counted over keys hashed into tables of ",
                   v.hash_rows(0), " rows with seed ", v.hash_seed(), ", not ", f.table_rows,
                   " and ", f.seed, ": convert with --table-rows ", v.hash_rows(0), " --seed ",
                   v.hash_seed(), " (the days are read through it)");
  }
  for (const auto& in : f.inputs) {
    STRATA_EXPECTS(std::filesystem::is_regular_file(in), "'", in.string(),
                   "' is not a file; name the TSV days to convert");
    const auto target = f.out / std::filesystem::path(in.stem()).replace_extension(".ctrb");
    STRATA_EXPECTS(f.overwrite || !std::filesystem::exists(target), "'", target.string(),
                   "' exists; pass --overwrite to replace it");
  }
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const flags f = parse(argc, argv);
    if (f.make_synthetic > 0) {
      for (std::size_t day = 0; day < f.inputs.size(); ++day) {
        data::synthetic_criteo gen;
        gen.rows = f.make_synthetic;
        gen.seed = f.seed;
        gen.distinct_ids = {f.distinct_ids};
        gen.first_row = day * f.make_synthetic;  // consecutive days of one teacher
        const auto r = data::write_synthetic_criteo(f.inputs[day], gen);
        std::printf("%s: %zu rows, CTR %.3f, teacher AUC %.4f, %.1f MB\n",
                    f.inputs[day].string().c_str(), r.rows, r.positive_rate, r.teacher_auc,
                    static_cast<double>(r.bytes) / 1e6);
      }
      return 0;
    }
    std::filesystem::create_directories(f.out);
    const auto vocabulary = f.out / std::string(data::ctr_vocabulary_name);
    if (f.min_count > 0) std::filesystem::remove(vocabulary);  // --overwrite (checked)
    if (!f.vocabulary.empty() && !(std::filesystem::exists(vocabulary) &&
                                   std::filesystem::equivalent(f.vocabulary, vocabulary)))
      std::filesystem::copy_file(f.vocabulary, vocabulary,
                                 std::filesystem::copy_options::overwrite_existing);
    data::criteo_options options;
    options.table_rows = {f.table_rows};
    options.hash_seed = f.seed;
    options.skip_bad_lines = f.skip_bad_lines;
    std::uint64_t bytes = 0;
    double seconds = 0;
    std::vector<std::filesystem::path> targets;
    for (const auto& in : f.inputs) {
      const auto target = f.out / std::filesystem::path(in.stem()).replace_extension(".ctrb");
      targets.push_back(target);
      const auto r = data::convert_criteo(in, target, options,
                                          {.chunk_rows = f.chunk_rows, .threads = f.threads});
      std::printf(
          "%s -> %s: %zu examples, %zu lines skipped, %.1f MB -> %.1f MB in %.2f s "
          "(%.0f MB/s of TSV)\n",
          in.string().c_str(), target.string().c_str(), r.summary.examples, r.summary.lines_skipped,
          static_cast<double>(r.tsv_bytes) / 1e6, static_cast<double>(r.output_bytes) / 1e6,
          r.seconds, r.tsv_mb_per_second());
      for (const auto& reason : r.summary.first_reasons)
        std::printf("  skipped %s\n", reason.c_str());
      bytes += r.tsv_bytes;
      seconds += r.seconds;
    }
    if (f.inputs.size() > 1)
      std::printf("total: %.1f MB of TSV in %.2f s (%.0f MB/s)\n", static_cast<double>(bytes) / 1e6,
                  seconds, seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0.0);
    if (f.min_count > 0) {
      const stopwatch clock;
      const auto v = data::build_ctr_vocabulary(data::ctr_files(targets), f.min_count);
      v.save(vocabulary);
      const auto rows = v.table_rows();
      const auto [low, high] = std::minmax_element(rows.begin(), rows.end());
      std::printf("%s: %s; tables of %llu .. %llu rows (hashed: %llu each), in %.2f s\n",
                  vocabulary.string().c_str(), v.describe().c_str(),
                  static_cast<unsigned long long>(*low), static_cast<unsigned long long>(*high),
                  static_cast<unsigned long long>(f.table_rows), clock.seconds());
    } else if (std::filesystem::exists(vocabulary)) {
      std::printf("%s: these days are read through it (%s)\n", vocabulary.string().c_str(),
                  data::ctr_vocabulary::load(vocabulary).describe().c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata_convert: %s\n", e.what());
    return 1;
  }
}

/// @file bench_data.cpp
/// Training data beyond memory (issue 18): the converted format against TSV, measured on the
/// programs users run.
///   1. Conversion: `convert_criteo` (what strata_convert runs) on a Criteo-format TSV from the
///      project's generator, in MB/s of TSV; baseline in the same run: `wc -l` on the same file
///      (a pass that only finds newlines); goal ≥ 200 MB/s on two cores.
///   2. The main job: `examples/ctr_train` (DLRM, Kaggle sizes, dim 16, 1 worker, allreduce,
///      Adagrad, batch 128, one epoch) trained from the converted days (`--data DIR`, memory
///      mapped, windowed shuffle) against the same rows as TSV loaded into memory (`--data
///      FILE.tsv`), and the same TSV streamed (`--stream`: chunks parsed as the shuffle window
///      reaches them); ratio = samples/s converted (or streamed) / in memory (goal ≥ 1.0: the
///      reader is never the bottleneck).
///   3. Resident memory: the peak RSS of those ctr_train processes at 1× and 10× the data
///      (getrusage of the child): converted and streamed data should not grow with the file,
///      TSV in memory does.
/// Verification: converted and TSV runs must both learn (eval AUC ≥ 0.6 on the held-out day)
/// and end within 0.01 AUC of each other (another example order, same data).
///
/// Usage: bench_data [--quick] [--json PATH] [--ctr-train PATH] [--keep DIR]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "strata/core/timer.hpp"
#include "strata/data/ctr_binary.hpp"
#include "strata/data/synthetic.hpp"

using namespace strata;
using bench::json_number;
using bench::read_file;
namespace fs = std::filesystem;

namespace {

/// A child process's output, exit status, wall time and peak resident memory.
struct child_run {
  std::string output;
  int status = -1;
  double seconds = 0;
  double max_rss_mib = 0;
};

/// Runs `argv` (no shell), capturing stdout and stderr; waits with wait4 for its rusage.
child_run run_child(const std::vector<std::string>& args) {
  int pipe_fds[2];
  if (::pipe(pipe_fds) != 0) fail(errc::io_error, "bench_data: pipe failed");
  const stopwatch clock;
  const pid_t pid = ::fork();
  if (pid < 0) fail(errc::io_error, "bench_data: fork failed");
  if (pid == 0) {
    ::dup2(pipe_fds[1], 1);
    ::dup2(pipe_fds[1], 2);
    ::close(pipe_fds[0]);
    ::close(pipe_fds[1]);
    std::vector<char*> argv;
    for (const auto& a : args)
      argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  ::close(pipe_fds[1]);
  child_run r;
  char buffer[4096];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;)
    r.output.append(buffer, static_cast<std::size_t>(n));
  ::close(pipe_fds[0]);
  struct rusage usage {};
  int status = 0;
  ::wait4(pid, &status, 0, &usage);
  r.seconds = clock.seconds();
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.max_rss_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
  return r;
}

struct job {
  double samples_per_s = 0, auc = 0, rss_mib = 0;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto opts = bench::options::parse(argc, argv, {}, {"--ctr-train", "--keep"});
    const std::string ctr_train = fs::absolute(opts.get("--ctr-train", STRATA_CTR_TRAIN_PATH));
    const std::string keep = opts.get("--keep", "");
    const fs::path dir = keep.empty()
                             ? fs::temp_directory_path() / cat("strata-bench-data-", ::getpid())
                             : fs::path(keep);
    fs::create_directories(dir);
    const std::size_t day_rows = opts.quick ? 20'000 : 200'000;
    const std::size_t large_days = 10;  // the 10x data: ten days of day_rows
    const std::uint64_t table_rows = 200'000;
    std::vector<bench::result> results;

    // Days of one teacher: day_0 .. day_9 train, "eval" (the rows after them) is held out.
    std::vector<fs::path> days;
    for (std::size_t d = 0; d <= large_days; ++d) {
      const fs::path p = dir / (d < large_days ? cat("day_", d, ".tsv") : std::string("eval.tsv"));
      data::synthetic_criteo gen;
      gen.rows = d < large_days ? day_rows : day_rows / 4;
      gen.seed = 1;
      gen.distinct_ids = {100'000};
      gen.first_row = d * day_rows;
      if (!fs::exists(p)) data::write_synthetic_criteo(p, gen);
      days.push_back(p);
    }
    // The 10x TSV as one file (the in-memory baseline reads one file).
    const fs::path all_tsv = dir / "all.tsv";
    if (!fs::exists(all_tsv)) {
      std::ofstream out(all_tsv, std::ios::binary);
      for (std::size_t d = 0; d < large_days; ++d)
        out << std::ifstream(days[d], std::ios::binary).rdbuf();
    }

    // 1. Conversion speed against wc -l, same file, same run (best of 3 each).
    data::criteo_options hashing;
    hashing.table_rows = {table_rows};
    hashing.hash_seed = 1;
    double convert_best = 0, wc_best = 0;
    const auto tsv_bytes = static_cast<double>(fs::file_size(all_tsv));
    for (int rep = 0; rep < 3; ++rep) {
      const auto r = data::convert_criteo(all_tsv, dir / "all.ctrb", hashing);
      convert_best = std::max(convert_best, r.tsv_mb_per_second());
      const auto wc = run_child({"/usr/bin/wc", "-l", all_tsv.string()});
      STRATA_EXPECTS(wc.status == 0, "bench_data: wc -l failed: ", wc.output);
      wc_best = std::max(wc_best, tsv_bytes / 1e6 / wc.seconds);
    }
    std::printf("conversion: %.0f MB/s of TSV (%.0f MB), wc -l %.0f MB/s\n", convert_best,
                tsv_bytes / 1e6, wc_best);
    results.push_back(
        {"convert_criteo MB/s vs wc -l", convert_best, "MB/s", wc_best, convert_best / wc_best});
    results.push_back(
        {"convert_criteo MB/s vs goal 200", convert_best, "MB/s", 200.0, convert_best / 200.0});

    // Converted days: 1x = day_0, 10x = day_0..day_9; the eval day converted alike.
    const auto convert_into = [&](const fs::path& to, std::size_t n) {
      fs::create_directories(to);
      for (std::size_t d = 0; d < n; ++d)
        if (!fs::exists(to / cat("day_", d, ".ctrb")))
          data::convert_criteo(days[d], to / cat("day_", d, ".ctrb"), hashing);
    };
    convert_into(dir / "conv1", 1);
    convert_into(dir / "conv10", large_days);
    fs::create_directories(dir / "eval");
    if (!fs::exists(dir / "eval" / "eval.ctrb"))
      data::convert_criteo(days[large_days], dir / "eval" / "eval.ctrb", hashing);

    // 2 + 3. The main job from converted files and from TSV in memory.
    const auto train = [&](const std::string& data, const std::string& eval,
                           const std::string& name, bool stream = false) {
      const fs::path report = dir / (name + ".json");
      std::vector<std::string> args = {
          ctr_train,   "--data",    data, "--eval-data",   eval,           "--strategy",
          "allreduce", "--workers", "1",  "--compressor",  "none",         "--batch",
          "128",       "--seed",    "1",  "--report-json", report.string()};
      if (data.ends_with(".tsv")) {  // converted data brings its tables' rows; TSV is told them
        args.push_back("--table-rows");
        args.push_back(cat(table_rows));
      }
      if (stream) args.push_back("--stream");
      const auto r = run_child(args);
      if (r.status != 0)
        fail(errc::internal, cat("bench_data: ctr_train ", name, " failed:\n", r.output));
      const std::string json = read_file(report);
      job j{json_number(json, "samples_per_s"), json_number(json, "eval_auc"), r.max_rss_mib};
      std::printf("%-22s %9.0f samples/s  eval AUC %.4f  peak RSS %7.1f MiB\n", name.c_str(),
                  j.samples_per_s, j.auc, j.rss_mib);
      if (!(j.auc >= 0.6))
        fail(errc::internal, cat("bench_data: ", name, " did not learn (eval AUC ", j.auc, ")"));
      return j;
    };
    const std::string eval_tsv = days[large_days].string();
    const std::string eval_conv = (dir / "eval").string();
    const job tsv1 = train(days[0].string(), eval_tsv, "tsv in memory 1x");
    const job conv1 = train((dir / "conv1").string(), eval_conv, "converted 1x");
    const job tsv10 = train(all_tsv.string(), eval_tsv, "tsv in memory 10x");
    const job conv10 = train((dir / "conv10").string(), eval_conv, "converted 10x");
    const job stream1 = train(days[0].string(), eval_tsv, "tsv streamed 1x", true);
    const job stream10 = train(all_tsv.string(), eval_tsv, "tsv streamed 10x", true);
    for (const auto& [a, b] : {std::pair{tsv1, conv1}, std::pair{tsv10, conv10},
                               std::pair{tsv1, stream1}, std::pair{tsv10, stream10}})
      if (std::abs(a.auc - b.auc) > 0.01)
        fail(errc::internal, cat("bench_data: converted and in-memory runs learn differently "
                                 "(eval AUC ",
                                 b.auc, " vs ", a.auc, ")"));
    results.push_back({"ctr_train samples/s converted vs tsv in memory, 1x", conv1.samples_per_s,
                       "samples/s", tsv1.samples_per_s, conv1.samples_per_s / tsv1.samples_per_s});
    results.push_back({"ctr_train samples/s converted vs tsv in memory, 10x", conv10.samples_per_s,
                       "samples/s", tsv10.samples_per_s,
                       conv10.samples_per_s / tsv10.samples_per_s});
    results.push_back({"peak RSS MiB converted 10x vs 1x", conv10.rss_mib, "MiB", conv1.rss_mib,
                       conv10.rss_mib / conv1.rss_mib});
    results.push_back({"peak RSS MiB tsv in memory 10x vs 1x", tsv10.rss_mib, "MiB", tsv1.rss_mib,
                       tsv10.rss_mib / tsv1.rss_mib});
    results.push_back({"ctr_train samples/s tsv streamed vs tsv in memory, 1x",
                       stream1.samples_per_s, "samples/s", tsv1.samples_per_s,
                       stream1.samples_per_s / tsv1.samples_per_s});
    results.push_back({"ctr_train samples/s tsv streamed vs tsv in memory, 10x",
                       stream10.samples_per_s, "samples/s", tsv10.samples_per_s,
                       stream10.samples_per_s / tsv10.samples_per_s});
    results.push_back({"peak RSS MiB tsv streamed 10x vs 1x", stream10.rss_mib, "MiB",
                       stream1.rss_mib, stream10.rss_mib / stream1.rss_mib});
    bench::report(opts, results);
    if (keep.empty()) fs::remove_all(dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_data: %s\n", e.what());
    return 1;
  }
}

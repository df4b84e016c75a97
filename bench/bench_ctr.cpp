/// @file bench_ctr.cpp
/// The main job end to end: `examples/ctr_train` — the program users build from the README —
/// training DLRM (Criteo Kaggle layer sizes, dim 16, 26 tables × 200k rows, Adagrad lr 0.02,
/// global batch 128 — ctr_train's --batch, split over the workers — one epoch) on a Criteo-format
/// TSV written by the project's generator (fixed seed; 200k training rows, 50k held-out rows), for
/// allreduce / ps / hybrid (sync, uncompressed) and `--strategy auto` at 1 and 2 workers, allreduce
/// also at 4 (AUC must not depend on the worker count); and, in the same run on the same rows, the
/// peers (bench/peers/dlrm_ctr_torch.py):
///   - PyTorch DLRM with nn.EmbeddingBag + torch Adagrad (Debian's torch 1.13, /usr/bin/python3,
///     and torch 2.x from the bench venv);
///   - DLRM whose tables are one FBGEMM SplitTableBatchedEmbeddingBagsCodegen (CPU,
///     EXACT_ADAGRAD fused into backward) — the kernels TorchRec trains with (bench venv).
/// The venv is made by `bench/peers/venv.sh` (torch 2.14 + fbgemm-gpu-cpu from PyPI); without it
/// only the Debian torch peer runs. Peers read the rows strata parsed (same hashing), written as
/// a flat binary file, so both sides train on identical keys.
///
/// Verification before any number is reported: every strata run must learn (eval AUC ≥ 0.6),
/// and the sync strategies at one worker count must end with bit-identical models (equal
/// checksums of the dense parameters and of every embedding row).
/// Reported: samples/s and eval AUC of every run; ratio = samples/s / the best peer's; ps and
/// hybrid against allreduce at the same worker count; eval AUC at 2 and 4 workers against 1.
///
/// Usage: bench_ctr [--quick] [--json PATH] [--ctr-train PATH] [--venv-python PATH]
///                  [--no-peers] [--keep DIR] [--distinct-ids K]
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "strata/data/criteo.hpp"
#include "strata/data/synthetic.hpp"

using namespace strata;
using bench::json_number;
using bench::read_file;
namespace fs = std::filesystem;

namespace {

std::string run_command(const std::string& command) {
  std::string text;
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return text;
  char buffer[4096];
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr)
    text += buffer;
  if (::pclose(pipe) != 0) text.clear();
  return text;
}

/// String after `"key": "` in a flat JSON object (empty when absent).
std::string json_string(const std::string& json, const std::string& key) {
  const auto at = json.find("\"" + key + "\"");
  if (at == std::string::npos) return {};
  const auto open = json.find('"', json.find(':', at));
  const auto close = json.find('"', open + 1);
  return open == std::string::npos || close == std::string::npos
             ? std::string{}
             : json.substr(open + 1, close - open - 1);
}

/// Splits `all` into its first `train_rows` lines and the rest.
void split_lines(const fs::path& all, std::size_t train_rows, const fs::path& train,
                 const fs::path& eval) {
  std::ifstream in(all);
  std::ofstream a(train), b(eval);
  std::string line;
  for (std::size_t i = 0; std::getline(in, line); ++i)
    (i < train_rows ? a : b) << line << '\n';
  if (!a || !b) fail(errc::io_error, "bench_ctr: cannot write the split TSV files");
}

/// The peers' input: magic, n, dense cols, sparse cols, labels, dense, keys (little-endian).
void write_peer_binary(const fs::path& path, const data::ctr_dataset& set) {
  std::ofstream out(path, std::ios::binary);
  const char magic[16] = "STRATA-CTR-BIN1";
  out.write(magic, 16);
  const std::uint64_t header[3] = {set.size(), set.dense_cols(), set.sparse_cols()};
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  out.write(reinterpret_cast<const char*>(set.labels().data()),
            static_cast<std::streamsize>(set.size() * sizeof(float)));
  out.write(reinterpret_cast<const char*>(set.dense().data()),
            static_cast<std::streamsize>(set.size() * set.dense_cols() * sizeof(float)));
  out.write(reinterpret_cast<const char*>(set.keys().data()),
            static_cast<std::streamsize>(set.size() * set.sparse_cols() * sizeof(std::uint64_t)));
  if (!out) fail(errc::io_error, cat("bench_ctr: cannot write ", path.string()));
}

struct run_result {
  std::string name;
  double samples_per_s = 0, auc = 0, logloss = 0;
  std::string checksum;  ///< strata runs: dense/embedding checksums
  std::string strategy;  ///< strata runs: the strategy that ran
  int workers = 1;
  bool peer = false;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto opts = bench::options::parse(
        argc, argv, {"--no-peers"}, {"--ctr-train", "--venv-python", "--keep", "--distinct-ids"});
    const bool peers =
        std::find(opts.rest.begin(), opts.rest.end(), "--no-peers") == opts.rest.end();
    const fs::path source_dir = fs::path(__FILE__).parent_path();
    const std::string ctr_train = opts.get("--ctr-train", STRATA_CTR_TRAIN_PATH);
    const std::string venv_python = opts.get(
        "--venv-python",
        (source_dir.parent_path() / "build" / "peers-venv" / "bin" / "peer-python").string());
    const std::string peer_script = (source_dir / "peers" / "dlrm_ctr_torch.py").string();
    const std::size_t train_rows = opts.quick ? 20'000 : 200'000;
    const std::size_t eval_rows = opts.quick ? 5'000 : 50'000;
    const std::uint64_t table_rows = 200'000;
    const auto distinct =
        opts.number<std::uint64_t>("--distinct-ids", 100'000, 1, std::uint64_t{1} << 40);
    const std::uint64_t seed = 1;  // data generator and ctr_train's hashing seed

    const std::string keep = opts.get("--keep", "");
    const fs::path dir = keep.empty()
                             ? fs::temp_directory_path() / cat("strata-bench-ctr-", ::getpid())
                             : fs::path(keep);
    fs::create_directories(dir);
    const fs::path all_tsv = dir / "all.tsv", train_tsv = dir / "train.tsv",
                   eval_tsv = dir / "eval.tsv";

    // ---- the data: the project's generator, written as Criteo TSV, split train / eval -----
    data::synthetic_criteo gen;
    gen.rows = train_rows + eval_rows;
    gen.seed = seed;
    gen.distinct_ids = {distinct};
    const auto made = data::write_synthetic_criteo(all_tsv, gen);
    split_lines(all_tsv, train_rows, train_tsv, eval_tsv);
    fs::remove(all_tsv);
    std::printf(
        "data: %zu train + %zu eval rows (Criteo TSV, %llu ids per feature, CTR %.3f, "
        "teacher AUC %.4f), tables 26 x %llu rows, dim 16\n",
        train_rows, eval_rows, static_cast<unsigned long long>(distinct), made.positive_rate,
        made.teacher_auc, static_cast<unsigned long long>(table_rows));

    std::vector<run_result> runs;
    // ---- strata: ctr_train itself, one process per run ---------------------------------------
    const std::string common =
        cat(" --data ", train_tsv.string(), " --eval-data ", eval_tsv.string(), " --table-rows ",
            table_rows, " --dim 16 --batch 128 --lr 0.02 --epochs 1 --seed ", seed,
            " --compressor none --consistency sync --no-progress");
    struct config {
      std::string strategy;
      int workers;
    };
    const std::vector<config> configs = {{"auto", 1},   {"allreduce", 1}, {"ps", 1},
                                         {"hybrid", 1}, {"allreduce", 2}, {"ps", 2},
                                         {"hybrid", 2}, {"allreduce", 4}};
    for (const auto& c : configs) {
      const fs::path report = dir / cat("report-", c.strategy, "-", c.workers, ".json");
      const std::string command =
          cat(ctr_train, common, " --strategy ", c.strategy, " --workers ", c.workers,
              " --report-json ", report.string(), " > ", (dir / "ctr_train.log").string(), " 2>&1");
      if (std::system(command.c_str()) != 0)
        fail(errc::internal,
             cat("bench_ctr: ctr_train failed: ", command, "\n", read_file(dir / "ctr_train.log")));
      const std::string json = read_file(report);
      run_result r;
      r.strategy = json_string(json, "strategy");
      r.workers = c.workers;
      r.name = cat("strata ", c.strategy == "auto" ? "auto (" + r.strategy + ")" : c.strategy, ", ",
                   c.workers, " worker", c.workers > 1 ? "s" : "");
      r.samples_per_s = json_number(json, "samples_per_s");
      r.auc = json_number(json, "eval_auc");
      r.logloss = json_number(json, "eval_logloss");
      r.checksum = json_string(json, "checksum");
      std::printf(
          "%-36s %9.0f samples/s  eval auc %.4f  logloss %.4f  (pull %.1f s, compute "
          "%.1f s, allreduce %.1f s, push %.1f s)\n",
          r.name.c_str(), r.samples_per_s, r.auc, r.logloss, json_number(json, "seconds_pull"),
          json_number(json, "seconds_compute"), json_number(json, "seconds_allreduce"),
          json_number(json, "seconds_push"));
      std::fflush(stdout);
      if (!(r.auc >= 0.6))
        fail(errc::internal, cat("bench_ctr: ", r.name, " did not learn (eval AUC ", r.auc, ")"));
      runs.push_back(r);
    }
    // Verification: the sync strategies are the same math, so the same bits.
    for (const auto& a : runs)
      for (const auto& b : runs)
        if (a.workers == b.workers && a.checksum != b.checksum)
          fail(errc::internal, cat("bench_ctr: ", a.name, " and ", b.name,
                                   " ended with different models (checksums ", a.checksum, " vs ",
                                   b.checksum, "); sync strategies must agree bitwise"));
    std::printf("verified: at each worker count every strategy ended with the same bits\n");

    // ---- peers ----------------------------------------------------------------------------
    if (peers) {
      data::criteo_options reader;
      reader.table_rows = {table_rows};
      reader.hash_seed = seed;  // as ctr_train --seed
      write_peer_binary(dir / "train.bin", data::load_criteo(train_tsv, reader));
      write_peer_binary(dir / "eval.bin", data::load_criteo(eval_tsv, reader));
      const std::string args =
          cat(" ", peer_script, " --train ", (dir / "train.bin").string(), " --eval ",
              (dir / "eval.bin").string(), " --table-rows ", table_rows,
              " --dim 16 --batch 128 --lr 0.02 --epochs 1 --threads 2");
      struct peer_run {
        std::string python, embedding;
      };
      std::vector<peer_run> peer_runs;
      if (!run_command("/usr/bin/python3 -c 'import torch' 2>/dev/null && echo ok").empty())
        peer_runs.push_back({"/usr/bin/python3", "bag"});
      else
        std::printf(
            "peer skipped: /usr/bin/python3 cannot import torch (apt-get install -y "
            "python3-torch libopenblas0-pthread)\n");
      if (fs::exists(venv_python)) {
        peer_runs.push_back({venv_python, "bag"});
        peer_runs.push_back({venv_python, "tbe"});
      } else {
        std::printf(
            "peers skipped: no %s (make it with bench/peers/venv.sh: torch 2.x + "
            "fbgemm-gpu-cpu from PyPI)\n",
            venv_python.c_str());
      }
      for (const auto& p : peer_runs) {
        const std::string json =
            run_command(cat(p.python, args, " --embedding ", p.embedding, " 2>/dev/null"));
        if (json.empty()) {
          std::printf("peer %s --embedding %s failed; skipped\n", p.python.c_str(),
                      p.embedding.c_str());
          continue;
        }
        run_result r;
        r.peer = true;
        r.name = json_string(json, "peer");
        r.samples_per_s = json_number(json, "samples_per_s");
        r.auc = json_number(json, "auc");
        r.logloss = json_number(json, "logloss");
        std::printf("%-36s %9.0f samples/s  eval auc %.4f  logloss %.4f\n", r.name.c_str(),
                    r.samples_per_s, r.auc, r.logloss);
        std::fflush(stdout);
        runs.push_back(r);
      }
    }

    // ---- report: every run against the best peer --------------------------------------------
    const run_result* best_peer = nullptr;
    for (const auto& r : runs)
      if (r.peer && (best_peer == nullptr || r.samples_per_s > best_peer->samples_per_s))
        best_peer = &r;
    std::vector<bench::result> results;
    for (const auto& r : runs) {
      const double base = best_peer ? best_peer->samples_per_s : 0;
      results.push_back({r.name + " samples/s" + (best_peer ? " vs " + best_peer->name : ""),
                         r.samples_per_s, "samples/s", base,
                         base > 0 ? r.samples_per_s / base : 0});
      const double base_auc = best_peer ? best_peer->auc : 0;
      results.push_back(
          {r.name + " eval AUC", r.auc, "auc", base_auc, base_auc > 0 ? r.auc / base_auc : 0});
    }
    // Strategies against allreduce at the same worker count (the PS path's cost).
    for (const auto& r : runs) {
      if (r.peer || r.strategy == "allreduce") continue;
      for (const auto& a : runs)
        if (!a.peer && a.strategy == "allreduce" && a.workers == r.workers &&
            a.name.find("auto") == std::string::npos)
          results.push_back({r.name + " vs allreduce", r.samples_per_s, "samples/s",
                             a.samples_per_s, r.samples_per_s / a.samples_per_s});
    }
    // Adding workers must not cost AUC: the global batch is fixed, so the model is the same up
    // to float summation order.
    for (const auto& r : runs) {
      if (r.peer || r.strategy != "allreduce" || r.workers == 1) continue;
      for (const auto& one : runs)
        if (!one.peer && one.strategy == "allreduce" && one.workers == 1 &&
            one.name.find("auto") == std::string::npos) {
          results.push_back(
              {r.name + " eval AUC vs 1 worker", r.auc, "auc", one.auc, r.auc / one.auc});
          if (std::abs(r.auc - one.auc) > 0.003)
            std::printf("warning: %s eval AUC %.4f is %.4f from 1 worker's %.4f (goal: 0.003)\n",
                        r.name.c_str(), r.auc, r.auc - one.auc, one.auc);
        }
    }
    bench::report(opts, results);
    if (keep.empty()) fs::remove_all(dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ctr: %s\n", e.what());
    return 1;
  }
}

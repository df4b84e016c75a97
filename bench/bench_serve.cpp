/// @file bench_serve.cpp
/// Serving: serve::predictor against onnxruntime running the same model, exported by
/// serve::export_onnx, in the same run.
///
/// Models: DLRM with the Criteo Kaggle MLPs (bottom 13-512-256-64-16, top 367-512-256-1) and
/// Wide & Deep (deep 429-256-128-1), 26 tables of --rows rows (default 100000; --quick 1000),
/// dim 16, fp32 bundles with the trainer's initial values (no training: timing needs only the
/// shapes). Inputs: 512 samples, dense uniform in [0, 3), keys uniform over each table.
///
/// Measured, each runtime limited to 2 threads:
///  - latency p50 / p99 of one caller at batch 1, 64 and 512, each the best of 1 and 2 threads
///    (predictor::predict under tbb::global_control; onnxruntime with 1 and 2 intra-op threads,
///    InferenceSession.run timed in Python: bench/peers/serve_ort.py). On a loaded machine a
///    runtime whose pool spins (onnxruntime's) loses time slices at 2 threads: the better
///    setting is kept for each side;
///  - throughput of 2 concurrent callers at batch 512 (onnxruntime: one session, 1 intra-op
///    thread, two Python threads; run() releases the GIL).
/// Verified before timing: onnxruntime's probabilities within 1e-5 of the predictor's.
/// Strata is timed before and after the peer (best of both).
///
/// Results: `<model>_b<B>_latency_p50` / `_p99` in us (baseline: onnxruntime; ratio < 1 means
/// strata answers faster) and `<model>_b512_2callers_throughput` in samples/s (ratio > 1 means
/// strata serves more). Without onnxruntime (bench/peers/ort_venv.sh makes build/ort-venv) or
/// without strata::onnx, baselines and ratios are 0 and the reason is printed.
///
///   bench_serve [--quick] [--json PATH] [--rows N] [--ms N] [--gemm eigen|onednn|cblas]
///               [--python PATH] [--peer PATH]
/// (--ms: milliseconds per latency measurement, twice that per throughput one; --gemm: the
/// predictor's engine, predictor_options::gemm, default the build's.)
#include <oneapi/tbb/global_control.h>

#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "strata/core/rng.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
#include "strata/serve.hpp"
#include "strata/serve/onnx.hpp"

namespace {

using namespace strata;
namespace fs = std::filesystem;

constexpr std::size_t samples = 512;
constexpr std::size_t throughput_batch = 512;
constexpr int thread_budget = 2;
const std::vector<std::size_t> latency_batches = {1, 64, 512};

struct latency {
  double p50_us = 0, p99_us = 0;
  std::size_t calls = 0;
};

/// A scratch directory removed with everything in it at scope exit.
struct work_dir {
  fs::path path = fs::temp_directory_path() / ("strata-bench-serve-" + std::to_string(::getpid()));
  work_dir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  work_dir(const work_dir&) = delete;
  work_dir& operator=(const work_dir&) = delete;
  ~work_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

/// The benchmark's inputs: `samples` rows of dense features and keys.
struct inputs {
  matrix<float> dense;
  matrix<std::uint64_t> keys;
  [[nodiscard]] matrix_view<const float> dense_rows(std::size_t n) const {
    return dense.view().rows_slice(0, n);
  }
  [[nodiscard]] matrix_view<const std::uint64_t> key_rows(std::size_t n) const {
    return keys.view().rows_slice(0, n);
  }
};

inputs make_inputs(const serve::bundle_manifest& m, std::size_t dense_features) {
  inputs in{matrix<float>(samples, dense_features),
            matrix<std::uint64_t>(samples, m.hash_rows.size())};
  const counter_rng rng{7, 11};
  for (std::size_t i = 0; i < samples; ++i) {
    for (std::size_t c = 0; c < dense_features; ++c)
      in.dense(i, c) = rng.uniform(i * 64 + c, 0.0f, 3.0f);
    for (std::size_t c = 0; c < m.hash_rows.size(); ++c)
      in.keys(i, c) = rng.below(i * 64 + 32 + c, m.hash_rows[c]);
  }
  return in;
}

template <class T>
void write_file(const fs::path& path, const T* data, std::size_t count) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(count * sizeof(T)));
  if (!out.flush()) fail(errc::io_error, cat("bench_serve: cannot write ", path.string()));
}

latency percentiles(std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  const auto at = [&](double q) {
    return us[std::min(us.size() - 1,
                       static_cast<std::size_t>(q * static_cast<double>(us.size())))];
  };
  return {at(0.50), at(0.99), us.size()};
}

/// One caller's latency of predict at batch `b`: 20 warm-up calls, then calls for `seconds`
/// (at least 50).
template <class Model>
latency time_latency(const serve::predictor<Model>& p, const inputs& in, std::size_t b,
                     double seconds) {
  std::vector<float> out(b);
  for (int i = 0; i < 20; ++i)
    p.predict(in.dense_rows(b), in.key_rows(b), out);
  std::vector<double> us;
  const stopwatch total;
  while (total.seconds() < seconds || us.size() < 50) {
    const stopwatch call;
    p.predict(in.dense_rows(b), in.key_rows(b), out);
    us.push_back(call.seconds() * 1e6);
  }
  return percentiles(us);
}

/// Samples per second of `callers` threads calling predict at batch `b` for `seconds`.
template <class Model>
double time_throughput(const serve::predictor<Model>& p, const inputs& in, std::size_t b,
                       int callers, double seconds) {
  std::atomic<bool> stop{false};
  std::vector<std::size_t> calls(static_cast<std::size_t>(callers), 0);
  std::vector<std::thread> threads;
  const stopwatch watch;
  for (int t = 0; t < callers; ++t)
    threads.emplace_back([&, t] {
      std::vector<float> out(b);
      while (!stop.load(std::memory_order_relaxed)) {
        p.predict(in.dense_rows(b), in.key_rows(b), out);
        ++calls[static_cast<std::size_t>(t)];
      }
    });
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads)
    t.join();
  const double elapsed = watch.seconds();
  std::size_t total = 0;
  for (const auto c : calls)
    total += c;
  return static_cast<double>(total * b) / elapsed;
}

struct measured {
  std::map<std::size_t, latency> latencies;
  double throughput = 0;
};

/// Keeps the lower p50 and the lower p99 of `kept` and `l`.
void keep_best(latency& kept, const latency& l) {
  if (kept.calls == 0 || l.p50_us < kept.p50_us) kept.p50_us = l.p50_us;
  if (kept.calls == 0 || l.p99_us < kept.p99_us) kept.p99_us = l.p99_us;
  kept.calls += l.calls;
}

/// Strata's numbers within the 2-thread budget (latencies at 1 and 2 threads); merged into
/// `best` (lowest latencies, highest throughput).
template <class Model>
void measure_ours(const serve::predictor<Model>& p, const inputs& in, double seconds,
                  measured& best) {
  for (int threads = 1; threads <= thread_budget; ++threads) {
    const tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                                    static_cast<std::size_t>(threads));
    for (const auto b : latency_batches)
      keep_best(best.latencies[b], time_latency(p, in, b, seconds));
  }
  const tbb::global_control limit(tbb::global_control::max_allowed_parallelism, thread_budget);
  best.throughput = std::max(best.throughput,
                             time_throughput(p, in, throughput_batch, thread_budget, seconds * 2));
}

/// The number after `"key": ` in a JSON line, or NaN.
double field(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\": ");
  if (at == std::string::npos) return std::nan("");
  return std::strtod(line.c_str() + at + key.size() + 4, nullptr);
}

struct peer_result {
  bool ran = false;
  std::string why;  ///< when it did not run, or failed its check
  std::string version;
  double max_abs_diff = 0;
  measured numbers;
};

peer_result run_peer(const std::string& python, const std::string& script, const fs::path& dir,
                     double seconds) {
  peer_result r;
  std::string batches;
  for (const auto b : latency_batches)
    batches += (batches.empty() ? "" : ",") + std::to_string(b);
  const std::string command =
      python + " " + script + " --model " + (dir / "model.onnx").string() + " --dense " +
      (dir / "dense.f32").string() + " --sparse " + (dir / "sparse.i64").string() + " --expected " +
      (dir / "expected.f32").string() + " --batches " + batches + " --seconds " +
      std::to_string(seconds) + " --throughput-batch " + std::to_string(throughput_batch) + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    r.why = "cannot start " + python;
    return r;
  }
  char buffer[4096];
  std::string errors;
  while (std::fgets(buffer, sizeof buffer, pipe) != nullptr) {
    const std::string line = buffer;
    if (const auto diff = field(line, "max_abs_diff"); !std::isnan(diff)) {
      r.max_abs_diff = diff;
      const auto v = line.find("\"version\": \"");
      if (v != std::string::npos) r.version = line.substr(v + 12, line.find('"', v + 12) - v - 12);
    } else if (const auto p50 = field(line, "p50_us"); !std::isnan(p50)) {
      keep_best(r.numbers.latencies[static_cast<std::size_t>(field(line, "batch"))],
                {p50, field(line, "p99_us"), static_cast<std::size_t>(field(line, "calls"))});
    } else if (const auto sps = field(line, "samples_per_s"); !std::isnan(sps)) {
      r.numbers.throughput = sps;
    } else {
      errors += line;
    }
  }
  const int status = pclose(pipe);
  r.ran = status == 0 && r.numbers.throughput > 0;
  if (!r.ran) r.why = cat("peer exited with status ", status, errors.empty() ? "" : ": ", errors);
  return r;
}

struct settings {
  std::uint64_t rows = 100000;
  nn::gemm_engine gemm = nn::default_gemm_engine();
  double seconds = 1.0;
  std::string python, script;
};

/// Bundle, predictor, ONNX model, inputs; strata, the peer, strata again; the results.
template <class Model>
void bench_model(const std::string& name, typename Model::config config, const settings& s,
                 const fs::path& work, std::vector<bench::result>& results) {
  config.table_rows = {s.rows};
  const fs::path dir = work / name;
  fs::create_directories(dir);
  {
    // A bundle of the untrained model: every row at the trainer's initial value (timing needs
    // only the shapes; serve::detail::write_bundle is what the exports call).
    const Model model(config);
    const stopwatch watch;
    serve::detail::write_bundle(model, config, model.parameters(), [](auto&&) {}, config.seed, 0,
                                "untrained", dir / "bundle", {});
    std::printf("%s: bundle of 26 tables x %llu rows written in %.2f s\n", name.c_str(),
                static_cast<unsigned long long>(s.rows), watch.seconds());
  }
  const serve::predictor<Model> p(dir / "bundle", {.gemm = s.gemm});
  const auto in = make_inputs(p.manifest(), p.dense_features());
  std::vector<float> expected(samples);
  p.predict(in.dense_rows(samples), in.key_rows(samples), expected);
  for (const float v : expected)
    if (!(v > 0.0f && v < 1.0f)) {
      std::fprintf(stderr, "bench_serve: %s: the predictor answered %g, not a probability\n",
                   name.c_str(), static_cast<double>(v));
      std::exit(1);
    }

  peer_result peer;
  if constexpr (serve::onnx_available) {
    const stopwatch watch;
    const auto r = serve::export_onnx(p, dir / "model.onnx");
    std::printf("%s: ONNX model exported in %.2f s (%llu + %llu bytes)\n", name.c_str(),
                watch.seconds(), static_cast<unsigned long long>(r.model_bytes),
                static_cast<unsigned long long>(r.data_bytes));
    write_file(dir / "dense.f32", in.dense.data(), samples * p.dense_features());
    std::vector<std::int64_t> keys(in.keys.data(), in.keys.data() + samples * p.sparse_features());
    write_file(dir / "sparse.i64", keys.data(), keys.size());
    write_file(dir / "expected.f32", expected.data(), expected.size());
  } else {
    peer.why = "this build has no ONNX export (Debian: libonnx-dev libprotobuf-dev)";
  }

  measured ours;
  measure_ours(p, in, s.seconds, ours);
  if (peer.why.empty()) {
    if (!fs::exists(s.python))
      peer.why = s.python + " not found (bench/peers/ort_venv.sh creates build/ort-venv)";
    else
      peer = run_peer(s.python, s.script, dir, s.seconds);
  }
  if (peer.ran && !(peer.max_abs_diff <= 1e-5)) {
    std::fprintf(stderr, "bench_serve: %s: onnxruntime differs from the predictor by %g\n",
                 name.c_str(), peer.max_abs_diff);
    std::exit(1);
  }
  measure_ours(p, in, s.seconds, ours);
  if (peer.ran)
    std::printf("%s: onnxruntime %s verified: max |onnxruntime - predictor| = %.3g\n", name.c_str(),
                peer.version.c_str(), peer.max_abs_diff);
  else
    std::printf("%s: onnxruntime peer skipped: %s\n", name.c_str(), peer.why.c_str());

  const auto add = [&](const std::string& what, double value, const char* unit, double base) {
    results.push_back({name + "_" + what, value, unit, base, base > 0 ? value / base : 0.0});
  };
  for (const auto b : latency_batches) {
    const auto& mine = ours.latencies[b];
    const auto theirs = peer.ran ? peer.numbers.latencies[b] : latency{};
    const auto prefix = cat("b", b, "_latency_");
    add(prefix + "p50_vs_onnxruntime", mine.p50_us, "us", theirs.p50_us);
    add(prefix + "p99_vs_onnxruntime", mine.p99_us, "us", theirs.p99_us);
  }
  add(cat("b", throughput_batch, "_2callers_throughput_vs_onnxruntime"), ours.throughput,
      "samples/s", peer.ran ? peer.numbers.throughput : 0.0);
}

}  // namespace

int main(int argc, char** argv) {
  const auto o =
      bench::options::parse(argc, argv, {}, {"--rows", "--ms", "--gemm", "--python", "--peer"});
  settings s;
  s.rows = o.number<std::uint64_t>("--rows", o.quick ? 1000 : 100000, 1, std::uint64_t{1} << 32);
  s.seconds = static_cast<double>(o.number<int>("--ms", o.quick ? 200 : 1000, 10, 600000)) / 1e3;
  const fs::path repo = fs::path(__FILE__).parent_path().parent_path();
  const auto gemm = o.get("--gemm", std::string(nn::to_string(nn::default_gemm_engine())));
  if (const auto e = nn::parse_gemm_engine(gemm); e && nn::gemm_available(*e)) {
    s.gemm = *e;
  } else {
    std::fprintf(stderr, "%s: --gemm '%s' is not an engine of this build (eigen%s%s)\n%s\n",
                 o.program.c_str(), gemm.c_str(),
                 nn::gemm_available(nn::gemm_engine::onednn) ? ", onednn" : "",
                 nn::gemm_available(nn::gemm_engine::cblas) ? ", cblas" : "", o.usage.c_str());
    return 2;
  }
  s.python = o.get("--python", (repo / "build" / "ort-venv" / "bin" / "python").string());
  s.script = o.get("--peer", (repo / "bench" / "peers" / "serve_ort.py").string());
  try {
    const work_dir work;
    std::vector<bench::result> results;
    models::dlrm::config dlrm;  // Criteo Kaggle MLPs, dim 16
    bench_model<models::dlrm>("serve_dlrm_kaggle", dlrm, s, work.path, results);
    models::wide_deep::config wide_deep;  // deep 429-256-128-1, dim 16
    bench_model<models::wide_deep>("serve_wide_deep", wide_deep, s, work.path, results);
    std::printf(
        "threads: at most %d per runtime (strata: tbb::global_control; onnxruntime: intra-op "
        "threads); latency = one caller, best of 1 and 2 threads; "
        "throughput = %d callers at batch %zu; %.2f s per measurement; "
        "predictor GEMM engine %s\n",
        thread_budget, thread_budget, throughput_batch, s.seconds,
        std::string(nn::to_string(s.gemm)).c_str());
    bench::report(o, results);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_serve: %s\n", e.what());
    return 1;
  }
  return 0;
}

/// @file bench_dlrm.cpp
/// Training-step throughput of DLRM's dense part (Criteo Kaggle config: bottom 13-512-256-64-16,
/// dot interaction of 27 vectors, top 367-512-256-1): forward + BCE loss + backward (including
/// the embedding-row gradients) + dense SGD update, embedding rows given as random inputs.
///
/// Baselines, all timed in the same run:
///  - the same model in PyTorch (bench/peers/dlrm_torch.py): Debian's torch 1.13 (--python,
///    default /usr/bin/python3) and PyPI's torch 2.x (--python2, default
///    <repo>/build/peers-venv/bin/peer-python from bench/peers/venv.sh; skipped when absent),
///    best of 1 and 2 threads each;
///  - the GEMM limit: the step's GEMM flops (6·Σ in·out per sample, 4· for the first layer)
///    divided into (a) a large 2048³ sgemm's rate on all threads and (b) the rate of the step's
///    largest layer (367→512) alone, forward and backward, through nn::linear;
///  - strata on each GEMM engine of the build (eigen, onednn, cblas) — the choice of
///    nn::default_gemm_engine().
/// Verifies first that SGD steps lower the loss on a fixed batch, on every engine.
///
///   bench_dlrm [--quick] [--json PATH] [--peer PATH/dlrm_torch.py] [--python /usr/bin/python3]
///              [--python2 PATH]
// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics when Eigen transposes
// packets (a known false positive); the rest of the file keeps every warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <tbb/global_control.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "strata/core/rng.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/nn/gemm.hpp"
#include "strata/nn/linear.hpp"
#include "strata/nn/loss.hpp"
#include "strata/nn/optimizers.hpp"

namespace {

using namespace strata;

/// One synthetic batch and the buffers of a step.
struct step_state {
  std::size_t batch;
  std::vector<float> dense, labels, logits, dlogits;
  std::vector<std::vector<float>> emb, emb_grad;
  std::vector<matrix_view<const float>> emb_views;
  std::vector<matrix_view<float>> grad_views;

  step_state(const models::dlrm& m, std::size_t b) : batch(b) {
    const counter_rng rng{1, b};
    std::uint64_t k = 0;
    dense.resize(b * m.dense_features());
    for (auto& v : dense)
      v = rng.uniform(k++);
    labels.resize(b);
    for (auto& v : labels)
      v = rng.uniform(k++) < 0.5f ? 0.0f : 1.0f;
    logits.resize(b);
    dlogits.resize(b);
    for (const auto& t : m.tables()) {
      emb.emplace_back(b * t.dim);
      for (auto& v : emb.back())
        v = rng.uniform(k++, -0.5f, 0.5f);
      emb_grad.emplace_back(b * t.dim);
      emb_views.emplace_back(emb.back().data(), b, t.dim);
      grad_views.emplace_back(emb_grad.back().data(), b, t.dim);
    }
  }

  double step(models::dlrm& m, const nn::sgd& opt) {
    m.forward({{dense.data(), batch, m.dense_features()}, emb_views}, logits);
    const double loss =
        nn::bce_with_logits(logits, labels, dlogits, 1.0f / static_cast<float>(batch));
    m.backward(dlogits, grad_views);
    opt.step(m.parameters(), m.gradients());
    return loss;
  }
};

/// PyTorch's samples/s per (batch, threads), or empty when torch is unavailable.
std::map<std::pair<std::size_t, int>, double> run_peer(const bench::options& o,
                                                       const std::string& python,
                                                       const std::string& batches) {
  std::string script = o.get("--peer", "");
  if (script.empty()) {
    std::string here = __FILE__;
    script = here.substr(0, here.find_last_of('/') + 1) + "peers/dlrm_torch.py";
  }
  const std::string samples = o.quick ? "1024" : "4096";
  const std::string command = python + " " + script + " --batch " + batches +
                              " --threads 1,2 --samples " + samples + " 2>&1";
  std::map<std::pair<std::size_t, int>, double> out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char line[1024];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    unsigned long b = 0;
    int t = 0;
    double sps = 0;
    const char* p = std::strstr(line, "\"batch\": ");
    const char* q = std::strstr(line, "\"threads\": ");
    const char* r = std::strstr(line, "\"samples_per_s\": ");
    if (p && q && r && std::sscanf(p, "\"batch\": %lu", &b) == 1 &&
        std::sscanf(q, "\"threads\": %d", &t) == 1 &&
        std::sscanf(r, "\"samples_per_s\": %lf", &sps) == 1) {
      out[{b, t}] = sps;
    } else {
      std::fprintf(stderr, "peer: %s", line);
    }
  }
  pclose(pipe);
  return out;
}

/// DLRM's GEMM flops per training sample: forward 2·in·out, backward 4·in·out per layer (2·
/// for the first, which needs no input gradient).
double gemm_flops_per_sample(const models::dlrm::config& c) {
  const std::size_t vectors = c.sparse_features + 1;
  std::vector<std::size_t> bottom = {c.dense_features};
  bottom.insert(bottom.end(), c.bottom_mlp.begin(), c.bottom_mlp.end());
  std::vector<std::size_t> top = {c.embedding_dim + vectors * (vectors - 1) / 2};
  top.insert(top.end(), c.top_mlp.begin(), c.top_mlp.end());
  double flops = 0;
  for (std::size_t l = 0; l + 1 < bottom.size(); ++l)
    flops += (l == 0 ? 4.0 : 6.0) * static_cast<double>(bottom[l] * bottom[l + 1]);
  for (std::size_t l = 0; l + 1 < top.size(); ++l)
    flops += 6.0 * static_cast<double>(top[l] * top[l + 1]);
  return flops;
}

/// GFLOP/s of one 2048³ sgemm on `engine`, its rows split over the machine's threads (each
/// block one single-threaded call, as the layers run their products).
double large_sgemm_gflops(nn::gemm_engine engine, int threads) {
  const std::size_t n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  const std::size_t block = (n + static_cast<std::size_t>(threads) - 1) / threads;
  const double seconds = bench::best_seconds(
      [&] {
        nn::detail::run_tasks(static_cast<std::size_t>(threads), threads > 1, [&](std::size_t t) {
          const std::size_t first = t * block;
          const std::size_t rows = std::min(block, n - first);
          nn::detail::gemm(engine, {a.data() + first * n, rows, n}, false, {b.data(), n, n}, false,
                           0.0f, {c.data() + first * n, rows, n});
        });
      },
      3);
  if (std::abs(c[5] - 0.125f * n) > 1e-3f * n) {
    std::fprintf(stderr, "bench_dlrm: sgemm verification failed (%g)\n", c[5]);
    std::exit(1);
  }
  return 2.0 * n * n * n / seconds / 1e9;
}

/// GFLOP/s of the 367 → 512 layer's forward + backward (with input gradient) at `batch`.
double layer_gflops(nn::gemm_engine engine, std::size_t batch, std::size_t in, std::size_t out) {
  nn::parameter_set ps;
  nn::linear layer(ps, in, out, "l");
  ps.allocate(1);
  layer.set_engine(engine);
  std::vector<float> x(batch * in, 0.5f), y(batch * out), dy(batch * out, 0.01f), dx(batch * in);
  const std::size_t reps = std::max<std::size_t>(1, 4096 / batch);
  const double seconds = bench::best_seconds(
      [&] {
        for (std::size_t r = 0; r < reps; ++r) {
          layer.forward(ps.values(), {x.data(), batch, in}, {y.data(), batch, out});
          layer.backward(ps.values(), {x.data(), batch, in}, {dy.data(), batch, out}, ps.grads(),
                         {dx.data(), batch, in});
        }
      },
      3);
  return 6.0 * static_cast<double>(batch * in * out * reps) / seconds / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const auto o = bench::options::parse(argc, argv, {}, {"--peer", "--python", "--python2"});
  const std::vector<std::size_t> batches =
      o.quick ? std::vector<std::size_t>{128} : std::vector<std::size_t>{128, 2048};
  const int threads = tbb::this_task_arena::max_concurrency();
  const nn::sgd opt{0.05f};
  std::vector<nn::gemm_engine> engines;
  for (const auto e : {nn::gemm_engine::eigen, nn::gemm_engine::onednn, nn::gemm_engine::cblas})
    if (nn::gemm_available(e)) engines.push_back(e);

  // Verify: SGD on one fixed batch lowers the loss, everything finite, on every engine.
  for (const auto engine : engines) {
    models::dlrm::config config;
    config.gemm = engine;
    models::dlrm m(config);
    step_state s(m, 256);
    const double first = s.step(m, opt);
    double last = first;
    for (int i = 0; i < 30; ++i)
      last = s.step(m, opt);
    if (!std::isfinite(last) || !(last < first - 0.02)) {
      std::fprintf(stderr, "bench_dlrm: verification failed on %s: loss %.6f -> %.6f\n",
                   std::string(nn::to_string(engine)).c_str(), first, last);
      return 1;
    }
    std::printf("verified (%s): loss on a fixed batch %.4f -> %.4f after 30 SGD steps\n",
                std::string(nn::to_string(engine)).c_str(), first, last);
  }

  std::string batch_list;
  for (auto b : batches)
    batch_list += (batch_list.empty() ? "" : ",") + std::to_string(b);

  // Strata is timed before and after the peers (best of both), so a load change on a shared
  // machine during a peer's run does not favour either side. Key: (engine, batch, threads).
  std::map<std::tuple<nn::gemm_engine, std::size_t, int>, double> ours;
  const auto measure_ours = [&] {
    for (const auto engine : engines) {
      for (const int t : {1, threads}) {
        if (t == 1 && engine != nn::default_gemm_engine() && threads > 1) continue;
        tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                                  static_cast<std::size_t>(t));
        for (const auto b : batches) {
          models::dlrm::config config;
          config.gemm = engine;
          models::dlrm m(config);
          step_state s(m, b);
          const std::size_t samples = o.quick ? 1024 : 4096;
          const std::size_t steps = std::max<std::size_t>(2, samples / b);
          const double seconds = bench::best_seconds(
              [&] {
                for (std::size_t i = 0; i < steps; ++i)
                  s.step(m, opt);
              },
              3);
          double& best = ours[{engine, b, t}];
          best = std::max(best, static_cast<double>(b * steps) / seconds);
        }
        if (threads == 1) break;
      }
    }
  };
  measure_ours();
  std::string python2 = o.get("--python2", "");
  if (python2.empty()) {
    const std::filesystem::path repo = std::filesystem::path(__FILE__).parent_path().parent_path();
    python2 = (repo / "build" / "peers-venv" / "bin" / "peer-python").string();
  }
  std::map<std::string, std::map<std::pair<std::size_t, int>, double>> peers;
  peers["torch1.13"] = run_peer(o, o.get("--python", "/usr/bin/python3"), batch_list);
  if (std::filesystem::exists(python2))
    peers["torch2"] = run_peer(o, python2, batch_list);
  else
    std::printf("torch 2.x peer skipped: %s not found (bench/peers/venv.sh creates it)\n",
                python2.c_str());
  measure_ours();
  if (peers["torch1.13"].empty() && peers["torch2"].empty())
    std::printf(
        "PyTorch peers skipped: torch not importable (apt-get install -y python3-torch "
        "libopenblas0-pthread) — ratios are 0\n");

  const double flops = gemm_flops_per_sample(models::dlrm::config{});
  const double large_gflops = large_sgemm_gflops(nn::default_gemm_engine(), threads);
  std::printf("GEMM flops per sample: %.3f M; 2048^3 sgemm (%s, %d threads): %.1f GFLOP/s\n",
              flops / 1e6, std::string(nn::to_string(nn::default_gemm_engine())).c_str(), threads,
              large_gflops);

  std::vector<bench::result> results;
  for (const auto b : batches) {
    double best_peer = 0;
    std::string best_peer_label = "none";
    for (const auto& [label, runs] : peers)
      for (const int t : {1, 2})
        if (auto it = runs.find({b, t}); it != runs.end() && it->second > best_peer) {
          best_peer = it->second;
          best_peer_label = label + "_" + std::to_string(t) + "t";
        }
    const std::string prefix = "dlrm_kaggle_train_b" + std::to_string(b) + "_";
    const double ours_default = ours[{nn::default_gemm_engine(), b, threads}];
    for (const auto engine : engines) {
      for (const int t : {threads, 1}) {
        const auto it = ours.find({engine, b, t});
        if (it == ours.end()) continue;
        results.push_back({prefix + "strata_" + std::string(nn::to_string(engine)) + "_" +
                               std::to_string(t) + "t_vs_" + best_peer_label,
                           it->second, "samples/s", best_peer,
                           best_peer > 0 ? it->second / best_peer : 0.0});
        if (threads == 1) break;
      }
    }
    const double eigen = ours[{nn::gemm_engine::eigen, b, threads}];
    for (const auto engine : engines)
      if (engine != nn::gemm_engine::eigen)
        results.push_back({prefix + std::string(nn::to_string(engine)) + "_vs_eigen",
                           ours[{engine, b, threads}], "samples/s", eigen,
                           ours[{engine, b, threads}] / eigen});
    const double large_limit = large_gflops * 1e9 / flops;
    results.push_back({prefix + "strata_vs_gemm_limit_2048cube", ours_default, "samples/s",
                       large_limit, ours_default / large_limit});
    const double layer_rate = layer_gflops(nn::default_gemm_engine(), b, 367, 512);
    const double layer_limit = layer_rate * 1e9 / flops;
    std::printf(
        "batch %zu: layer 367->512 fwd+bwd %.1f GFLOP/s -> limit %.0f samples/s; "
        "2048^3 limit %.0f samples/s\n",
        b, layer_rate, layer_limit, large_limit);
    results.push_back({prefix + "strata_vs_gemm_limit_layer367x512", ours_default, "samples/s",
                       layer_limit, ours_default / layer_limit});
  }
  std::printf(
      "strata threads: %d (oneTBB default arena; rows 1t ran under global_control 1); "
      "default GEMM engine %s\n",
      threads, std::string(nn::to_string(nn::default_gemm_engine())).c_str());
  for (const auto& [label, runs] : peers)
    for (const auto& [key, sps] : runs)
      std::printf("%s batch %zu threads %d: %.1f samples/s\n", label.c_str(), key.first, key.second,
                  sps);
  bench::report(o, results);
  return 0;
}

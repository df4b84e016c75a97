/// @file bench_gpu_worker.cpp
/// The GPU worker (cuda::dlrm) on DLRM's Criteo Kaggle configuration:
/// - model step: forward + BCE + backward (embedding-row gradients included) + SGD on the dense
///   parameters, with the embedding rows in host memory as a trainer hands them over (rows up,
///   row gradients down every step). Baselines in the same run: strata's CPU model
///   (models::dlrm, every core) and, when `torch.cuda` works on this machine, PyTorch on the
///   same GPU with the same host-resident rows (bench/peers/dlrm_torch.py --device cuda).
/// - trainer: train::trainer<cuda::dlrm, local<adagrad>, ring_allreduce> with one worker on a
///   synthetic CTR set (embedding gather / update on the CPU) against the same trainer with
///   models::dlrm.
/// Verifies first: GPU logits match the CPU model's (≤ 1e-3 relative), SGD lowers the loss, and
/// the GPU trainer's evaluation AUC is within 0.01 of the CPU trainer's.
/// Built only with CUDA (tests/cuda/CMakeLists.txt); needs a GPU to run (exits 0 with SKIP
/// otherwise).
///
///   bench_gpu_worker [--quick] [--json PATH] [--peer PATH/dlrm_torch.py] [--python PYTHON]
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 + Eigen AVX-512, see bench_dlrm

#include <cuda_runtime.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench_common.hpp"
#include "strata/core/rng.hpp"
#include "strata/cuda/dlrm.hpp"
#include "strata/data/batch.hpp"
#include "strata/embedding/local.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/nn/loss.hpp"
#include "strata/nn/optimizers.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"

namespace {

using namespace strata;

/// One synthetic batch with host-resident embedding rows, and the buffers of a step.
struct step_state {
  std::size_t batch;
  std::vector<float> dense, labels, logits, dlogits;
  std::vector<std::vector<float>> emb, emb_grad;
  std::vector<matrix_view<const float>> emb_views;
  std::vector<matrix_view<float>> grad_views;

  template <class Model>
  step_state(const Model& m, std::size_t b) : batch(b) {
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

  template <class Model>
  double step(Model& m, const nn::sgd& opt) {
    m.forward({{dense.data(), batch, m.dense_features()}, emb_views}, logits);
    const double loss =
        nn::bce_with_logits(logits, labels, dlogits, 1.0f / static_cast<float>(batch));
    m.backward(dlogits, grad_views);
    opt.step(m.parameters(), m.gradients());
    return loss;
  }
};

/// PyTorch-on-the-GPU samples/s per batch, or empty when torch with CUDA is unavailable.
std::map<std::size_t, double> run_peer(const bench::options& o, const std::string& batches) {
  std::string script = o.get("--peer", "");
  if (script.empty()) {
    std::string here = __FILE__;
    script = here.substr(0, here.find_last_of('/') + 1) + "peers/dlrm_torch.py";
  }
  const std::string python = o.get("--python", "/usr/bin/python3");
  const std::string command = python + " " + script + " --device cuda --threads 1 --batch " +
                              batches + " --samples " + (o.quick ? "8192" : "65536") + " 2>&1";
  std::map<std::size_t, double> out;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return out;
  char line[1024];
  while (std::fgets(line, sizeof line, pipe) != nullptr) {
    unsigned long b = 0;
    double sps = 0;
    const char* p = std::strstr(line, "\"batch\": ");
    const char* r = std::strstr(line, "\"samples_per_s\": ");
    if (p && r && std::sscanf(p, "\"batch\": %lu", &b) == 1 &&
        std::sscanf(r, "\"samples_per_s\": %lf", &sps) == 1)
      out[b] = sps;
    else
      std::fprintf(stderr, "peer: %s", line);
  }
  pclose(pipe);
  return out;
}

cuda::dlrm::config gpu_config(const models::dlrm::config& c) {
  return {c, 0};
}

/// A learnable synthetic CTR set with the Kaggle shape (13 dense, 26 sparse, 10^5 ids each).
data::ctr_dataset make_data(std::size_t n) {
  data::ctr_dataset set(13, 26);
  const counter_rng rng{9, 9};
  std::array<float, 13> dense{};
  std::array<std::uint64_t, 26> keys{};
  for (std::size_t i = 0; i < n; ++i) {
    double logit = -1.0;
    for (std::size_t d = 0; d < dense.size(); ++d) {
      dense[d] = rng.uniform(i * 64 + d);
      logit += (d % 2 == 0 ? 0.4 : -0.4) * dense[d];
    }
    for (std::size_t f = 0; f < keys.size(); ++f) {
      keys[f] = rng.below(i * 64 + 16 + f, 100000);
      logit += keys[f] % 5 == 0 ? 0.5 : -0.1;
    }
    set.append(dense, keys,
               rng.uniform_double(i * 64 + 63) < 1.0 / (1.0 + std::exp(-logit)) ? 1.0f : 0.0f);
  }
  return set;
}

template <class Model>
train::train_report train_once(const typename Model::config& c, const data::ctr_dataset& train,
                               const data::ctr_dataset& eval, std::size_t batch) {
  using trainer = train::trainer<Model, embedding::local<optim::adagrad>, comm::ring_allreduce>;
  train::trainer_options o;
  o.workers = 1;
  o.batch = batch;
  o.epochs = 1;
  o.progress = false;
  o.timeout_seconds = 600;
  optim::adagrad opt;
  opt.lr = 0.05f;
  trainer t(c, opt, o);
  return t.fit(train, &eval);
}

}  // namespace

int main(int argc, char** argv) {
  const auto o = bench::options::parse(argc, argv, {}, {"--peer", "--python"});
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIP: no CUDA device found; bench_gpu_worker needs a GPU\n");
    bench::report(o, {});
    return 0;
  }
  const nn::sgd opt{0.05f};
  const models::dlrm::config kaggle;

  // Verify the model step: same logits as the CPU model, and SGD lowers the loss.
  {
    models::dlrm cpu(kaggle);
    cuda::dlrm gpu(gpu_config(kaggle));
    step_state s(cpu, 256);
    std::vector<float> want(256), got(256);
    cpu.forward({{s.dense.data(), 256, 13}, s.emb_views}, want);
    gpu.forward({{s.dense.data(), 256, 13}, s.emb_views}, got);
    double worst = 0;
    for (std::size_t i = 0; i < 256; ++i)
      worst = std::max(worst, std::fabs(double(got[i]) - want[i]) /
                                  std::max({std::fabs(double(want[i])), 1e-2}));
    const double first = s.step(gpu, opt);
    double last = first;
    for (int i = 0; i < 30; ++i)
      last = s.step(gpu, opt);
    if (worst > 1e-3 || !std::isfinite(last) || !(last < first - 0.02)) {
      std::fprintf(stderr,
                   "bench_gpu_worker: verification failed: logits differ from the CPU model by "
                   "%.3g (relative), loss %.6f -> %.6f\n",
                   worst, first, last);
      return 1;
    }
    std::printf(
        "verified: GPU logits within %.2g of the CPU model; loss %.4f -> %.4f after 30 SGD "
        "steps\n",
        worst, first, last);
  }

  const std::vector<std::size_t> batches =
      o.quick ? std::vector<std::size_t>{2048} : std::vector<std::size_t>{128, 2048, 8192};
  std::string batch_list;
  for (auto b : batches)
    batch_list += (batch_list.empty() ? "" : ",") + std::to_string(b);
  const auto measure = [&](auto& model, std::size_t b, std::size_t samples) {
    step_state s(model, b);
    const std::size_t steps = std::max<std::size_t>(2, samples / b);
    const double seconds = bench::best_seconds(
        [&] {
          for (std::size_t i = 0; i < steps; ++i)
            s.step(model, opt);
        },
        3);
    return static_cast<double>(b * steps) / seconds;
  };
  std::map<std::size_t, double> gpu_sps, cpu_sps;
  for (const auto b : batches) {
    cuda::dlrm gpu(gpu_config(kaggle));
    gpu_sps[b] = measure(gpu, b, o.quick ? 16384 : 131072);
    models::dlrm cpu(kaggle);
    cpu_sps[b] = measure(cpu, b, o.quick ? 2048 : 8192);
  }
  const auto peer = run_peer(o, batch_list);
  if (peer.empty())
    std::printf("PyTorch GPU peer skipped: torch with CUDA is not importable here\n");

  std::vector<bench::result> results;
  for (const auto b : batches) {
    const std::string base = "dlrm_kaggle_step_b" + std::to_string(b) + "_gpu";
    results.push_back(
        {base + "_vs_strata_cpu", gpu_sps[b], "samples/s", cpu_sps[b], gpu_sps[b] / cpu_sps[b]});
    if (const auto it = peer.find(b); it != peer.end())
      results.push_back(
          {base + "_vs_torch_gpu", gpu_sps[b], "samples/s", it->second, gpu_sps[b] / it->second});
  }

  // The whole trainer, one worker: the GPU model vs the CPU model, same data and optimizer.
  {
    const std::size_t n = o.quick ? 40000 : 200000;
    const auto train_set = make_data(n);
    const auto eval_set = make_data(20000);
    const std::size_t batch = 2048;
    models::dlrm::config c = kaggle;
    c.table_rows = {100000};
    const auto on_gpu = train_once<cuda::dlrm>(gpu_config(c), train_set, eval_set, batch);
    const auto on_cpu = train_once<models::dlrm>(c, train_set, eval_set, batch);
    const double auc_gpu = on_gpu.evals.back().auc, auc_cpu = on_cpu.evals.back().auc;
    std::printf(
        "trainer, 1 worker, batch %zu, %zu samples: GPU %.0f samples/s (AUC %.4f), CPU "
        "%.0f samples/s (AUC %.4f)\n",
        batch, n, on_gpu.samples_per_second, auc_gpu, on_cpu.samples_per_second, auc_cpu);
    if (std::fabs(auc_gpu - auc_cpu) > 0.01) {
      std::fprintf(stderr, "bench_gpu_worker: verification failed: AUC GPU %.4f vs CPU %.4f\n",
                   auc_gpu, auc_cpu);
      return 1;
    }
    results.push_back({"dlrm_trainer_1worker_b2048_gpu_vs_cpu", on_gpu.samples_per_second,
                       "samples/s", on_cpu.samples_per_second,
                       on_gpu.samples_per_second / on_cpu.samples_per_second});
    std::printf("GPU trainer phases (s):");
    for (std::size_t p = 0; p < train::phase_count; ++p)
      std::printf(" %s %.2f", train::phase_names[p], on_gpu.phase_seconds[p]);
    std::printf("\n");
  }
  bench::report(o, results);
  return 0;
}

/// @file bench_resnet.cpp
/// Training throughput of models::resnet (ResNet-20: n = 3, widths 16/32/64, 1 × 28 × 28
/// inputs, 10 classes, batch 128): forward + softmax cross-entropy + backward + SGD-momentum
/// step, in images/s. Baselines timed in the same run: the same network in PyTorch
/// (bench/peers/resnet_torch.py, NCHW and channels-last, 1 and 2 threads) under Debian's torch
/// 1.13 (--python, default /usr/bin/python3) and PyPI's torch 2.14 (--python2, default
/// <repo>/build/peers-venv/bin/peer-python from bench/peers/venv.sh; skipped when absent) —
/// the best of all is the baseline — and strata's other convolution engines (im2col + Eigen,
/// and oneDNN's direct kernels when the build has oneDNN) against the default (Winograd).
/// Verifies first that SGD steps on one fixed batch lower the loss.
///
///   bench_resnet [--quick] [--json PATH] [--peer PATH/resnet_torch.py] [--python /usr/bin/python3]
///                [--python2 PATH] [--batch 128] [--depth-n 3]
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 false positive in Eigen

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
#include "strata/models/resnet.hpp"
#include "strata/nn/softmax_cross_entropy.hpp"

namespace {

using namespace strata;

/// One fixed random batch and an SGD-momentum step (the optimizer of the peer).
struct trainer {
  models::resnet net;
  std::size_t batch;
  std::vector<float> images, logits, dlogits, velocity;
  std::vector<std::uint8_t> labels;

  trainer(std::size_t n, std::size_t b, nn::conv_engine engine = nn::default_conv_engine)
      : net(models::resnet::config{.blocks_per_stage = n}), batch(b) {
    net.set_conv_engine(engine);
    const counter_rng rng{3, b};
    images.resize(b * net.input_size());
    for (std::size_t i = 0; i < images.size(); ++i)
      images[i] = rng.normal(i);
    labels.resize(b);
    for (std::size_t i = 0; i < b; ++i)
      labels[i] = static_cast<std::uint8_t>(rng.below(images.size() + i, 10));
    logits.resize(b * 10);
    dlogits.resize(b * 10);
    velocity.assign(net.parameters().size(), 0.0f);
  }

  double step(float lr) {
    net.forward({images.data(), batch, net.input_size()}, {logits.data(), batch, 10});
    const double loss = nn::softmax_cross_entropy<std::uint8_t>({logits.data(), batch, 10}, labels,
                                                                {dlogits.data(), batch, 10},
                                                                1.0f / static_cast<float>(batch));
    net.backward({dlogits.data(), batch, 10});
    auto p = net.parameters();
    const auto g = net.gradients();
    for (std::size_t i = 0; i < p.size(); ++i) {
      velocity[i] = 0.9f * velocity[i] + g[i];
      p[i] -= lr * velocity[i];
    }
    return loss;
  }
};

/// PyTorch's images/s per threads (best over NCHW and channels-last) under `python`, or empty.
std::map<int, double> run_peer(const bench::options& o, const std::string& python,
                               const std::string& label, std::size_t batch, std::size_t n) {
  std::string script = o.get("--peer", "");
  if (script.empty()) {
    std::string here = __FILE__;
    script = here.substr(0, here.find_last_of('/') + 1) + "peers/resnet_torch.py";
  }
  std::map<int, double> out;
  for (const char* layout : {"", " --channels-last"}) {
    const std::string command = python + " " + script + " --batch " + std::to_string(batch) +
                                " --n " + std::to_string(n) + " --threads 1,2 --steps " +
                                (o.quick ? "2" : "4") + " --repeats 2" + layout + " 2>&1";
    FILE* pipe = popen(command.c_str(), "r");
    if (pipe == nullptr) return out;
    char line[1024];
    while (std::fgets(line, sizeof line, pipe) != nullptr) {
      int t = 0;
      double ips = 0;
      const char* q = std::strstr(line, "\"threads\": ");
      const char* r = std::strstr(line, "\"images_per_s\": ");
      if (q && r && std::sscanf(q, "\"threads\": %d", &t) == 1 &&
          std::sscanf(r, "\"images_per_s\": %lf", &ips) == 1) {
        std::printf("%s %s threads %d: %.1f images/s\n", label.c_str(),
                    *layout ? "channels_last" : "NCHW", t, ips);
        out[t] = std::max(out[t], ips);
      } else {
        std::fprintf(stderr, "peer: %s", line);
      }
    }
    pclose(pipe);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const auto o = bench::options::parse(
        argc, argv, {}, {"--peer", "--python", "--python2", "--batch", "--depth-n"});
    const std::size_t batch = o.number<std::size_t>("--batch", 128, 1, std::size_t{1} << 16);
    const std::size_t n = o.number<std::size_t>("--depth-n", 3, 1, 200);
    const int threads = tbb::this_task_arena::max_concurrency();

    {  // Verify: SGD on one fixed batch lowers the loss; everything finite.
      trainer t(n, 64);
      const double first = t.step(0.05f);
      double last = first;
      for (int i = 0; i < 8; ++i)
        last = t.step(0.05f);
      if (!std::isfinite(last) || !(last < first - 0.1)) {
        std::fprintf(stderr, "bench_resnet: verification failed: loss %.4f -> %.4f\n", first, last);
        return 1;
      }
      std::printf("verified: ResNet-%zu loss on a fixed batch %.4f -> %.4f after 8 steps\n",
                  6 * n + 2, first, last);
    }

    // Strata is timed before and after the peer (best of both) so that a load change on the
    // shared machine during the peer's run favours neither side.
    std::map<int, double> ours;
    double ours_im2col = 0, ours_onednn = 0;  // the other engines, same threads
    const int steps = o.quick ? 2 : 4;
    const auto images_per_s = [&](int t, nn::conv_engine engine) {
      tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                                static_cast<std::size_t>(t));
      trainer tr(n, batch, engine);
      const double seconds = bench::best_seconds(
          [&] {
            for (int i = 0; i < steps; ++i)
              tr.step(0.01f);
          },
          2);
      return static_cast<double>(batch) * steps / seconds;
    };
    const auto measure_ours = [&] {
      for (const int t : {threads, 1}) {
        ours[t] = std::max(ours[t], images_per_s(t, nn::default_conv_engine));
        if (threads == 1) break;
      }
      ours_im2col = std::max(ours_im2col, images_per_s(threads, nn::conv_engine::im2col));
      if (nn::onednn_available)
        ours_onednn = std::max(ours_onednn, images_per_s(threads, nn::conv_engine::onednn));
    };
    measure_ours();
    std::string python2 = o.get("--python2", "");
    if (python2.empty()) {
      const std::filesystem::path repo =
          std::filesystem::path(__FILE__).parent_path().parent_path();
      python2 = (repo / "build" / "peers-venv" / "bin" / "peer-python").string();
    }
    std::map<std::string, std::map<int, double>> peers;
    peers["torch1.13"] = run_peer(o, o.get("--python", "/usr/bin/python3"), "torch1.13", batch, n);
    if (std::filesystem::exists(python2))
      peers["torch2"] = run_peer(o, python2, "torch2", batch, n);
    else
      std::printf("torch 2.x peer skipped: %s not found (bench/peers/venv.sh creates it)\n",
                  python2.c_str());
    measure_ours();
    double best_peer = 0;
    int best_threads = 0;
    std::string best_label = "none";
    for (const auto& [label, runs] : peers)
      for (const auto& [t, ips] : runs)
        if (ips > best_peer) {
          best_peer = ips;
          best_threads = t;
          best_label = label;
        }
    if (best_peer == 0)
      std::printf(
          "PyTorch peer skipped: torch not importable (apt-get install -y python3-torch "
          "libopenblas0-pthread) — ratios are 0\n");
    else
      std::printf("best peer: %s, %d threads, %.1f images/s\n", best_label.c_str(), best_threads,
                  best_peer);
    std::vector<bench::result> results;
    for (const auto& [t, ips] : ours)
      results.push_back({"resnet" + std::to_string(6 * n + 2) + "_train_b" + std::to_string(batch) +
                             "_strata" + std::to_string(t) + "t_vs_torch_best" +
                             std::to_string(best_threads) + "t",
                         ips, "images/s", best_peer, best_peer > 0 ? ips / best_peer : 0.0});
    const std::string engine_row = "resnet" + std::to_string(6 * n + 2) + "_train_b" +
                                   std::to_string(batch) + "_strata" + std::to_string(threads) +
                                   "t_" + std::string(to_string(nn::default_conv_engine));
    results.push_back({engine_row + "_vs_im2col", ours[threads], "images/s", ours_im2col,
                       ours[threads] / ours_im2col});
    if (nn::onednn_available)
      results.push_back({engine_row + "_vs_onednn", ours[threads], "images/s", ours_onednn,
                         ours[threads] / ours_onednn});
    std::printf(
        "strata threads: %d (oneTBB default arena; 1t rows under global_control 1), convolutions: "
        "%s\n",
        threads, std::string(to_string(nn::default_conv_engine)).c_str());
    bench::report(o, results);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_resnet: %s\n", e.what());
    return 1;
  }
}

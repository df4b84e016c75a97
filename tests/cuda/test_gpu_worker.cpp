// The GPU worker: cuda::dlrm against models::dlrm (forward, backward, bitwise repeatability),
// then whole trainer runs with cuda::dlrm against the same runs with models::dlrm. Compiled by
// the host compiler (the trainer needs Eigen and oneTBB); the device half of cuda::dlrm comes
// from dlrm_impl.cu. Cases needing a GPU skip with a clear message when there is none.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <random>
#include <vector>

#include <cuda_runtime.h>

#include "support/skip.hpp"

#include "strata/core/rng.hpp"
#include "strata/cuda/dlrm.hpp"
#include "strata/data/batch.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/sgd.hpp"
#include "strata/train/trainer.hpp"

using namespace strata;

namespace {

bool skip_without_gpu() {
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0) return false;
  (void)cudaGetLastError();
  strata_test::skip(
      "no CUDA device found (cudaGetDeviceCount reports none); this GPU-worker test was compiled "
      "but not run. Run scripts/gpu-check.sh on a GPU machine.");
  return true;
}

cuda::dlrm::config gpu_config(const models::dlrm::config& c) {
  return {c, 0};
}

models::dlrm::config model_config() {
  models::dlrm::config c;
  c.dense_features = 13;
  c.sparse_features = 8;
  c.embedding_dim = 16;
  c.table_rows = {1000};
  c.bottom_mlp = {64, 32, 16};
  c.top_mlp = {64, 32, 1};
  c.seed = 11;
  return c;
}

/// |got − want| ≤ rel · max(|got|, |want|, floor): the two sides differ only in the order of
/// the GEMM sums (cuBLAS vs Eigen), so values near zero are judged against `floor`.
void require_close(std::span<const float> got, std::span<const float> want, double rel,
                   double floor) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = want[i];
    const double scale = std::max({std::fabs(a), std::fabs(b), floor});
    if (!(std::fabs(a - b) <= rel * scale)) {
      CAPTURE(i, a, b, rel, floor);
      REQUIRE(std::fabs(a - b) <= rel * scale);
    }
  }
}

/// `fraction` of the largest |value| in `want` (at least `least`): the floor for sums whose
/// terms cancel, where a different summation order errs by ~1e-7 of the terms' magnitude
/// rather than of the (small) result.
double floor_of(std::span<const float> want, double fraction, double least) {
  double largest = 0.0;
  for (const float v : want)
    largest = std::max(largest, static_cast<double>(std::fabs(v)));
  return std::max(least, fraction * largest);
}

struct random_batch {
  matrix<float> dense;
  std::vector<matrix<float>> rows;
  std::vector<matrix_view<const float>> views;
};

random_batch make_batch(const models::dlrm::config& c, std::size_t batch, std::mt19937_64& gen) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  random_batch b{matrix<float>(batch, c.dense_features), {}, {}};
  for (std::size_t i = 0; i < b.dense.size(); ++i)
    b.dense.data()[i] = u(gen);
  for (std::size_t t = 0; t < c.sparse_features; ++t) {
    b.rows.emplace_back(batch, c.embedding_dim);
    for (std::size_t i = 0; i < b.rows.back().size(); ++i)
      b.rows.back().data()[i] = 0.3f * u(gen);
  }
  for (const auto& r : b.rows)
    b.views.push_back(r.view());
  return b;
}

/// A small learnable CTR problem (as in tests/train/test_trainer.cpp, 13 dense, 8 sparse).
data::ctr_dataset make_data(std::size_t n, std::uint64_t seed) {
  data::ctr_dataset set(13, 8);
  counter_rng rng{seed, 7};
  for (std::size_t i = 0; i < n; ++i) {
    std::array<float, 13> dense{};
    std::array<std::uint64_t, 8> keys{};
    double logit = -0.5;
    for (std::size_t d = 0; d < dense.size(); ++d) {
      dense[d] = rng.uniform(i * 32 + d, -1.0f, 1.0f);
      logit += 0.3 * dense[d] * (d % 2 == 1 ? -1 : 1);
    }
    for (std::size_t f = 0; f < keys.size(); ++f) {
      keys[f] = rng.below(i * 32 + 16 + f, 1000);
      logit += (keys[f] % 3 == 0 ? 0.6 : -0.2);
    }
    const float label =
        rng.uniform_double(i * 32 + 30) < 1.0 / (1.0 + std::exp(-logit)) ? 1.0f : 0.0f;
    set.append(dense, keys, label);
  }
  return set;
}

train::trainer_options options(int workers, int servers) {
  train::trainer_options o;
  o.workers = workers;
  o.servers = servers;
  o.batch = 128;
  o.max_steps = 20;
  o.seed = 5;
  o.dense_row = 64;
  o.progress = false;
  o.timeout_seconds = 60;
  return o;
}

}  // namespace

TEST_CASE("cuda::dlrm forward and backward match models::dlrm", "[cuda][gpu_worker]") {
  if (skip_without_gpu()) return;
  const auto seed = std::random_device{}();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  const auto c = model_config();
  models::dlrm cpu(c);
  cuda::dlrm gpu(gpu_config(c));
  for (std::size_t batch : {1u, 37u, 256u, 1000u}) {
    CAPTURE(batch);
    const auto b = make_batch(c, batch, gen);
    const models::ctr_inputs in{b.dense.view(), b.views};
    std::vector<float> want(batch), got(batch, std::nanf(""));
    cpu.forward(in, want);
    gpu.forward(in, got);
    require_close(got, want, 1e-4, 1e-3);

    std::vector<float> dlogits(batch);
    for (auto& v : dlogits)
      v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen) / static_cast<float>(batch);
    std::vector<matrix<float>> cpu_grads, gpu_grads;
    std::vector<matrix_view<float>> cpu_views, gpu_views;
    for (std::size_t t = 0; t < c.sparse_features; ++t) {
      cpu_grads.emplace_back(batch, c.embedding_dim);
      gpu_grads.emplace_back(batch, c.embedding_dim);
      std::fill_n(gpu_grads.back().data(), gpu_grads.back().size(), std::nanf(""));
      std::fill_n(gpu.gradients().data(), gpu.gradients().size(), std::nanf(""));
    }
    for (std::size_t t = 0; t < c.sparse_features; ++t) {
      cpu_views.push_back(cpu_grads[t].view());
      gpu_views.push_back(gpu_grads[t].view());
    }
    cpu.backward(dlogits, cpu_views);
    gpu.backward(dlogits, gpu_views);
    require_close(gpu.gradients(), cpu.gradients(), 1e-4, floor_of(cpu.gradients(), 0.05, 1e-6));
    for (std::size_t t = 0; t < c.sparse_features; ++t) {
      const std::span<const float> want(cpu_grads[t].data(), cpu_grads[t].size());
      require_close({gpu_grads[t].data(), gpu_grads[t].size()}, want, 1e-4,
                    floor_of(want, 0.05, 1e-7));
    }

    // The same step again: bitwise the same results (no atomics, fixed orders).
    std::vector<float> again(batch);
    const std::vector<float> grads_before(gpu.gradients().begin(), gpu.gradients().end());
    gpu.forward(in, again);
    gpu.backward(dlogits, gpu_views);
    CHECK(std::equal(again.begin(), again.end(), got.begin(), [](float x, float y) {
      return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
    }));
    CHECK(std::equal(grads_before.begin(), grads_before.end(), gpu.gradients().begin(),
                     [](float x, float y) {
                       return std::bit_cast<std::uint32_t>(x) == std::bit_cast<std::uint32_t>(y);
                     }));
  }
}

TEST_CASE("cuda::dlrm uploads parameters changed on the host between steps", "[cuda][gpu_worker]") {
  if (skip_without_gpu()) return;
  std::mt19937_64 gen(3);
  const auto c = model_config();
  models::dlrm cpu(c);
  cuda::dlrm gpu(gpu_config(c));
  const auto b = make_batch(c, 64, gen);
  const models::ctr_inputs in{b.dense.view(), b.views};
  std::vector<float> want(64), got(64);
  gpu.forward(in, got);
  for (std::size_t i = 0; i < cpu.parameters().size(); ++i) {
    cpu.parameters()[i] *= 1.5f;
    gpu.parameters()[i] *= 1.5f;
  }
  cpu.forward(in, want);
  gpu.forward(in, got);
  require_close(got, want, 1e-4, 1e-3);
}

TEST_CASE("cuda::dlrm rejects bad inputs with clear errors", "[cuda][gpu_worker]") {
  // Shape checks run before the device is touched: these run without a GPU too.
  const auto c = model_config();
  cuda::dlrm gpu(gpu_config(c));
  std::mt19937_64 gen(4);
  auto b = make_batch(c, 8, gen);
  std::vector<float> logits(8);
  matrix<float> wrong_dense(8, 12);
  CHECK_THROWS_WITH(
      gpu.forward(models::ctr_inputs{wrong_dense.view(), b.views}, logits),
      Catch::Contains("dense input has 12 features") && Catch::Contains("expects 13"));
  auto fewer = b.views;
  fewer.pop_back();
  CHECK_THROWS_WITH(gpu.forward(models::ctr_inputs{b.dense.view(), fewer}, logits),
                    Catch::Contains("got 7 embedding inputs"));
  std::vector<float> short_logits(7);
  CHECK_THROWS_WITH(gpu.forward(models::ctr_inputs{b.dense.view(), b.views}, short_logits),
                    Catch::Contains("logits size is 7"));
  std::vector<float> dlogits(8);
  std::vector<matrix_view<float>> none;
  CHECK_THROWS_WITH(gpu.backward(dlogits, none), Catch::Contains("before forward"));

  auto far = gpu_config(c);
  far.device = 4096;
  cuda::dlrm absent(far);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  (void)cudaGetLastError();
  if (devices == 0)
    CHECK_THROWS_WITH(absent.forward(models::ctr_inputs{b.dense.view(), b.views}, logits),
                      Catch::Contains("no CUDA device found"));
  else
    CHECK_THROWS_WITH(absent.forward(models::ctr_inputs{b.dense.view(), b.views}, logits),
                      Catch::Contains("config::device = 4096"));
}

TEST_CASE("a GPU worker trains the model the CPU worker trains (hybrid, CPU parameter servers)",
          "[cuda][gpu_worker][train]") {
  if (skip_without_gpu()) return;
  const auto data = make_data(6000, 1);
  optim::adagrad opt;
  opt.lr = 0.05f;
  using cpu_trainer =
      train::trainer<models::dlrm, embedding::sharded<optim::adagrad>, train::hybrid<ps::sync>>;
  using gpu_trainer =
      train::trainer<cuda::dlrm, embedding::sharded<optim::adagrad>, train::hybrid<ps::sync>>;
  cpu_trainer on_cpu(model_config(), opt, options(2, 2));
  gpu_trainer on_gpu(gpu_config(model_config()), opt, options(2, 2));
  const auto a = on_cpu.fit(data, &data);
  const auto b = on_gpu.fit(data, &data);
  REQUIRE(b.steps == 20);
  // 20 Adagrad steps amplify rounding differences a little; the models stay the same model.
  require_close(on_gpu.dense_parameters(), on_cpu.dense_parameters(), 1e-3, 1e-2);
  REQUIRE(!a.evals.empty());
  REQUIRE(!b.evals.empty());
  CHECK(std::fabs(a.evals.back().auc - b.evals.back().auc) < 2e-3);
  CHECK(std::fabs(a.train_loss - b.train_loss) < 1e-3);
  // Embedding rows on the servers: the same rows were touched, with close values.
  std::vector<float> rows_a, rows_b;
  on_cpu.for_each_embedding_row(
      [&](std::size_t, std::uint64_t, std::span<const float> row, std::span<const float>) {
        rows_a.insert(rows_a.end(), row.begin(), row.end());
      });
  on_gpu.for_each_embedding_row(
      [&](std::size_t, std::uint64_t, std::span<const float> row, std::span<const float>) {
        rows_b.insert(rows_b.end(), row.begin(), row.end());
      });
  REQUIRE(rows_a.size() == rows_b.size());
  std::sort(rows_a.begin(), rows_a.end());
  std::sort(rows_b.begin(), rows_b.end());
  require_close(rows_b, rows_a, 1e-3, 1e-2);
}

TEST_CASE("GPU workers under ring allreduce match CPU workers; GPU runs repeat bitwise",
          "[cuda][gpu_worker][train]") {
  if (skip_without_gpu()) return;
  const auto data = make_data(6000, 2);
  optim::sgd opt;
  opt.lr = 0.1f;
  using cpu_trainer =
      train::trainer<models::dlrm, embedding::local<optim::sgd>, comm::ring_allreduce>;
  using gpu_trainer =
      train::trainer<cuda::dlrm, embedding::local<optim::sgd>, comm::ring_allreduce>;
  cpu_trainer on_cpu(model_config(), opt, options(2, 0));
  gpu_trainer on_gpu(gpu_config(model_config()), opt, options(2, 0));
  gpu_trainer again(gpu_config(model_config()), opt, options(2, 0));
  on_cpu.fit(data);
  const auto first = on_gpu.fit(data);
  const auto second = again.fit(data);
  require_close(on_gpu.dense_parameters(), on_cpu.dense_parameters(), 1e-3, 1e-2);
  CHECK(first.dense_checksum == second.dense_checksum);
  CHECK(first.embedding_checksum == second.embedding_checksum);
}

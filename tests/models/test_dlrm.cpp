#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include <tbb/global_control.h>

#include "strata/core/rng.hpp"
#include "strata/cuda/dlrm.hpp"
#include "strata/models.hpp"
#include "strata/nn/loss.hpp"
#include "strata/nn/mlp.hpp"

#include "models/support.hpp"

using namespace strata;

using namespace model_test;

namespace {
/// float64 DLRM: mean BCE over the batch for params p and embedded rows e (per table).
double dlrm_loss_ref(const models::dlrm& m, const std::vector<double>& p,
                     const std::vector<std::vector<double>>& e, const batch_data& b) {
  const auto& c = m.get_config();
  const std::size_t d = c.embedding_dim, n = c.sparse_features + 1;
  const auto z =
      mlp_ref(m.parameter_blocks(), p, "bottom", {b.dense.begin(), b.dense.end()}, b.rows, true);
  std::vector<double> x;
  for (std::size_t r = 0; r < b.rows; ++r) {
    const auto vec = [&](std::size_t i, std::size_t col) {
      return i == 0 ? z[r * d + col] : e[i - 1][r * d + col];
    };
    for (std::size_t col = 0; col < d; ++col)
      x.push_back(z[r * d + col]);
    for (std::size_t i = 1; i < n; ++i)
      for (std::size_t j = 0; j < i; ++j) {
        double s = 0;
        for (std::size_t col = 0; col < d; ++col)
          s += vec(i, col) * vec(j, col);
        x.push_back(s);
      }
  }
  const auto logits = mlp_ref(m.parameter_blocks(), p, "top", x, b.rows, false);
  double loss = 0;
  for (std::size_t r = 0; r < b.rows; ++r) {
    const double l = logits[r], y = b.labels[r];
    loss += std::max(l, 0.0) - l * y + std::log1p(std::exp(-std::abs(l)));
  }
  return loss / static_cast<double>(b.rows);
}

models::dlrm::config small_config() {
  models::dlrm::config c;
  c.dense_features = 3;
  c.sparse_features = 3;
  c.embedding_dim = 4;
  c.table_rows = {100};
  c.bottom_mlp = {6, 4};
  c.top_mlp = {5, 1};
  c.seed = 3;
  return c;
}

void require_close(std::span<const float> got, const std::vector<double>& want, double tol,
                   const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(what << "[" << i << "] got " << got[i] << " want " << want[i]);
    REQUIRE(std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i])));
  }
}

}  // namespace

static_assert(models::ctr_model<models::dlrm>);
static_assert(!models::ctr_model<int>);

TEST_CASE("dlrm defaults are the Criteo Kaggle configuration", "[models][dlrm]") {
  const models::dlrm m;
  const auto tables = m.tables();
  REQUIRE(tables.size() == 26);
  REQUIRE(m.dense_features() == 13);
  REQUIRE(tables[0].name == "C1");
  REQUIRE(tables[2].rows == 10131227);
  for (const auto& t : tables)
    REQUIRE(t.dim == 16);
  const std::size_t bottom = 13 * 512 + 512 + 512 * 256 + 256 + 256 * 64 + 64 + 64 * 16 + 16;
  const std::size_t top = 367 * 512 + 512 + 512 * 256 + 256 + 256 + 1;
  REQUIRE(m.parameters().size() == bottom + top);
  REQUIRE(m.parameter_blocks().blocks()[8].name == "top.0.weight");
  REQUIRE(m.parameter_blocks().blocks()[8].size == 367 * 512);
}

TEST_CASE("dlrm gradients match float64 finite differences", "[models][dlrm]") {
  models::dlrm m(small_config());
  const batch_data b(4, 3, m.tables(), 100);
  std::vector<std::vector<float>> eg;
  const double loss = train_step(m, b, eg, b.rows);

  std::vector<double> p(m.parameters().begin(), m.parameters().end());
  std::vector<std::vector<double>> e;
  for (const auto& v : b.emb)
    e.emplace_back(v.begin(), v.end());
  REQUIRE(loss / b.rows == Approx(dlrm_loss_ref(m, p, e, b)).epsilon(1e-5));

  const auto gp =
      numeric_grad([&](const std::vector<double>& q) { return dlrm_loss_ref(m, q, e, b); }, p);
  require_close(m.gradients(), gp, 2e-4, "dparams");
  for (std::size_t t = 0; t < e.size(); ++t) {
    const auto ge = numeric_grad(
        [&](const std::vector<double>& q) {
          auto e2 = e;
          e2[t] = q;
          return dlrm_loss_ref(m, p, e2, b);
        },
        e[t]);
    require_close(eg[t], ge, 2e-4, "dembedding");
  }
}

namespace {
models::dlrm::config parallel_config() {
  models::dlrm::config c;
  c.dense_features = 13;
  c.sparse_features = 8;
  c.embedding_dim = 16;
  c.table_rows = {1000};
  c.bottom_mlp = {64, 16};
  c.top_mlp = {130, 1};
  c.seed = 11;
  return c;
}
}  // namespace

TEST_CASE("dlrm is deterministic: same seed, 1 or 2 threads, bitwise", "[models][dlrm]") {
  const auto c = parallel_config();
  models::dlrm a(c), b(c);
  REQUIRE(std::equal(a.parameters().begin(), a.parameters().end(), b.parameters().begin()));
  auto c2 = c;
  c2.seed = 12;
  const models::dlrm other(c2);
  REQUIRE(!std::equal(a.parameters().begin(), a.parameters().end(), other.parameters().begin()));

  const batch_data data(520, c.dense_features, a.tables(), 300);  // parallel path (≥ 256 rows)
  std::vector<std::vector<float>> ga, gb;
  {
    tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
    train_step(a, data, ga, data.rows);
  }
  {
    tbb::global_control two(tbb::global_control::max_allowed_parallelism, 2);
    train_step(b, data, gb, data.rows);
  }
  REQUIRE(std::equal(a.gradients().begin(), a.gradients().end(), b.gradients().begin()));
  REQUIRE(ga == gb);
}

TEST_CASE("dlrm: gradient of a 2B batch is the sum of its two halves", "[models][dlrm]") {
  const auto c = parallel_config();
  models::dlrm m(c);
  const std::size_t half = 260;
  const batch_data full(2 * half, c.dense_features, m.tables(), 500);
  std::vector<std::vector<float>> eg_full;
  train_step(m, full, eg_full, 2 * half);
  const std::vector<float> g_full(m.gradients().begin(), m.gradients().end());

  std::vector<double> g_sum(g_full.size(), 0.0);
  for (std::size_t h = 0; h < 2; ++h) {
    batch_data part = full;
    part.rows = half;
    part.dense.assign(
        full.dense.begin() + static_cast<std::ptrdiff_t>(h * half * c.dense_features),
        full.dense.begin() + static_cast<std::ptrdiff_t>((h + 1) * half * c.dense_features));
    part.labels.assign(full.labels.begin() + static_cast<std::ptrdiff_t>(h * half),
                       full.labels.begin() + static_cast<std::ptrdiff_t>((h + 1) * half));
    for (std::size_t t = 0; t < part.emb.size(); ++t) {
      const std::size_t d = c.embedding_dim;
      part.emb[t].assign(full.emb[t].begin() + static_cast<std::ptrdiff_t>(h * half * d),
                         full.emb[t].begin() + static_cast<std::ptrdiff_t>((h + 1) * half * d));
      part.views[t] = matrix_view<const float>(part.emb[t].data(), half, d);
    }
    std::vector<std::vector<float>> eg;
    train_step(m, part, eg, 2 * half);  // scale 1/global batch
    for (std::size_t i = 0; i < g_sum.size(); ++i)
      g_sum[i] += m.gradients()[i];
    for (std::size_t t = 0; t < eg.size(); ++t)
      for (std::size_t i = 0; i < eg[t].size(); ++i)
        REQUIRE(std::abs(eg[t][i] - eg_full[t][h * half * c.embedding_dim + i]) <= 1e-6);
  }
  for (std::size_t i = 0; i < g_sum.size(); ++i)
    REQUIRE(std::abs(g_full[i] - g_sum[i]) <= 1e-5);
}

TEST_CASE("dlrm rejects bad configs and bad inputs, naming what", "[models][dlrm]") {
  auto c = small_config();
  c.bottom_mlp = {6, 5};
  REQUIRE_THROWS_WITH(models::dlrm(c), Catch::Contains("bottom MLP must end in embedding_dim = 4"));
  c = small_config();
  c.top_mlp = {5, 2};
  REQUIRE_THROWS_WITH(models::dlrm(c), Catch::Contains("top MLP must end in 1 output"));
  c = small_config();
  c.table_rows = {1, 2};
  REQUIRE_THROWS_WITH(models::dlrm(c), Catch::Contains("table_rows has 2 entries for 3"));

  models::dlrm m(small_config());
  std::vector<float> logits(4), dl(4);
  REQUIRE_THROWS_WITH(m.backward(dl, {}), Catch::Contains("before forward"));
  const batch_data b(4, 3, m.tables(), 1);
  auto in = b.inputs(3);
  in.dense = matrix_view<const float>(b.dense.data(), 3, 4);
  try {
    m.forward(in, logits);
    FAIL("no throw");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::size_mismatch);
    REQUIRE_THAT(e.what(),
                 Catch::Contains("dense input has 4 features per sample but the model expects 3"));
  }
  in = b.inputs(3);
  in.embedded = std::span(b.views).first(2);
  REQUIRE_THROWS_WITH(m.forward(in, logits),
                      Catch::Contains("got 2 embedding inputs but the model reads 3"));
  auto views = b.views;
  views[1] = matrix_view<const float>(b.emb[1].data(), 2, 4);
  in = b.inputs(3);
  in.embedded = views;
  REQUIRE_THROWS_WITH(
      m.forward(in, logits),
      Catch::Contains("embedding input of table 1 'C2' is 2 x 4 but must be 4 x 4"));
  REQUIRE_THROWS_WITH(m.forward(b.inputs(3), std::span(logits).first(3)),
                      Catch::Contains("logits size is 3 but must be 4"));
  m.forward(b.inputs(3), logits);
  std::vector<std::vector<float>> g(3, std::vector<float>(16));
  std::vector<matrix_view<float>> gv;
  for (auto& v : g)
    gv.emplace_back(v.data(), 4, 4);
  REQUIRE_THROWS_WITH(m.backward(std::span(dl).first(2), gv),
                      Catch::Contains("dlogits size is 2 but must be 4"));
  gv[2] = matrix_view<float>(g[2].data(), 4, 3);
  REQUIRE_THROWS_WITH(m.backward(dl, gv),
                      Catch::Contains("gradient view of table 2 'C3' is 4 x 3"));
}

TEST_CASE("dlrm_layers is DLRM's layout: the Kaggle widths, registered as nn::mlp registers them",
          "[models][dlrm]") {
  const models::dlrm_layers kaggle{models::dlrm_config{}};
  CHECK(kaggle.bottom == std::vector<std::size_t>{13, 512, 256, 64, 16});
  CHECK(kaggle.top == std::vector<std::size_t>{367, 512, 256, 1});
  CHECK(models::dlrm_interaction_cols(26, 16) == 367);
  // nn::add_mlp's blocks are nn::mlp's, layer by layer, and their sizes sum to the model's.
  nn::parameter_set by_blocks, by_mlp;
  const auto blocks = nn::add_mlp(by_blocks, kaggle.top, "top");
  const nn::mlp top(by_mlp, kaggle.top, false, "top");
  REQUIRE(blocks.size() == top.layers().size());
  for (std::size_t l = 0; l < blocks.size(); ++l) {
    CHECK(blocks[l].weight_offset == top.layers()[l].weight_offset());
    CHECK(blocks[l].bias_offset == top.layers()[l].bias_offset());
    CHECK(blocks[l].in == top.layers()[l].in());
  }
  nn::parameter_set whole;
  (void)nn::add_mlp(whole, kaggle.bottom, "bottom");
  (void)nn::add_mlp(whole, kaggle.top, "top");
  CHECK(whole.size() == models::dlrm_sizes<models::criteo_kaggle_dlrm>::dense_parameters);
  nn::parameter_set empty;
  CHECK_THROWS_WITH(nn::add_mlp(empty, std::vector<std::size_t>{5}, "x"),
                    Catch::Contains("needs at least an input and an output size"));
}

TEST_CASE("cuda::dlrm's host half has models::dlrm's parameter blocks and initial values",
          "[models][dlrm][cuda]") {
  // Needs no GPU and no CUDA compiler: the device half (dlrm_impl.cuh) is not linked here.
  const auto cpu_config = small_config();
  const cuda::dlrm::config gpu_config{cpu_config, 0};  // the CPU sizes plus a device
  const models::dlrm cpu(cpu_config);
  const cuda::dlrm gpu(gpu_config);
  const auto& a = cpu.parameter_blocks().blocks();
  const auto& b = gpu.parameter_blocks().blocks();
  REQUIRE(a.size() == b.size());
  for (std::size_t k = 0; k < a.size(); ++k) {
    CHECK(a[k].name == b[k].name);
    CHECK(a[k].offset == b[k].offset);
    CHECK(a[k].size == b[k].size);
  }
  const auto pa = cpu.parameters();
  const auto pb = gpu.parameters();
  REQUIRE(std::equal(pa.begin(), pa.end(), pb.begin(), pb.end()));
  CHECK(gpu.tables().size() == cpu.tables().size());
  CHECK(gpu.tables()[1].name == cpu.tables()[1].name);
  CHECK(gpu.interaction_cols() == 4 + 4 * 3 / 2);
  CHECK(gpu.top_layers().front().in == gpu.interaction_cols());

  auto bad = gpu_config;
  bad.bottom_mlp = {6, 5};
  CHECK_THROWS_WITH(cuda::dlrm(bad), Catch::Contains("must end in embedding_dim"));
  bad = gpu_config;
  bad.device = -1;
  CHECK_THROWS_WITH(cuda::dlrm(bad), Catch::Contains("device must be a CUDA device index"));
  bad = gpu_config;
  bad.table_rows = {1, 2};
  CHECK_THROWS_WITH(cuda::dlrm(bad), Catch::Contains("table_rows has 2 entries"));
}

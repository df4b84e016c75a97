// nn::detail::gemm on every engine of the build against a float64 product, the engines'
// names and refusals, and the thread-count independence of linear / DLRM on each engine.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <tbb/global_control.h>

#include "strata/core/rng.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/nn.hpp"

using namespace strata;

namespace {

std::vector<nn::gemm_engine> built_gemm_engines() {
  std::vector<nn::gemm_engine> engines;
  for (const auto e : {nn::gemm_engine::eigen, nn::gemm_engine::onednn, nn::gemm_engine::cblas})
    if (nn::gemm_available(e)) engines.push_back(e);
  return engines;
}

std::vector<float> random_values(std::size_t n, std::uint64_t stream) {
  const counter_rng rng{9, stream};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = rng.uniform(i, -1.0f, 1.0f);
  return v;
}

/// Element (r, c) of op(x) for a row-major view x.
double at(matrix_view<const float> x, bool transposed, std::size_t r, std::size_t c) {
  return transposed ? x(c, r) : x(r, c);
}

}  // namespace

TEST_CASE("gemm equals a float64 product on every engine, transposes, strides and beta",
          "[nn][gemm]") {
  const auto engine = GENERATE(from_range(built_gemm_engines()));
  const bool ta = GENERATE(false, true);
  const bool tb = GENERATE(false, true);
  const float beta = GENERATE(0.0f, 1.0f);
  // k = 300 spans several of the libraries' k-blocks; strides leave columns unused. One-row
  // and one-column products take CBLAS's matrix-vector path.
  const auto [m, n] =
      GENERATE(table<std::size_t, std::size_t>({{37, 21}, {1, 21}, {37, 1}, {1, 1}}));
  const std::size_t k = 300, pad = 3;
  INFO(nn::to_string(engine) << " m=" << m << " n=" << n << " ta=" << ta << " tb=" << tb
                             << " beta=" << beta);
  const std::size_t a_rows = ta ? k : m, a_cols = ta ? m : k;
  const std::size_t b_rows = tb ? n : k, b_cols = tb ? k : n;
  const auto a_values = random_values(a_rows * (a_cols + pad), 1);
  const auto b_values = random_values(b_rows * (b_cols + pad), 2);
  auto c_values = random_values(m * (n + pad), 3);
  const auto c_before = c_values;
  const matrix_view<const float> a(a_values.data(), a_rows, a_cols, a_cols + pad);
  const matrix_view<const float> b(b_values.data(), b_rows, b_cols, b_cols + pad);
  const matrix_view<float> c(c_values.data(), m, n, n + pad);
  nn::detail::gemm(engine, a, ta, b, tb, beta, c);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      double want = beta * static_cast<double>(c_before[i * (n + pad) + j]);
      for (std::size_t p = 0; p < k; ++p)
        want += at(a, ta, i, p) * at(b, tb, p, j);
      INFO("c(" << i << ", " << j << ")");
      REQUIRE(std::abs(c(i, j) - want) <= 1e-4 * (1.0 + std::abs(want)));
    }
    for (std::size_t j = n; j < n + pad; ++j)  // the stride's padding is never written
      REQUIRE(c_values[i * (n + pad) + j] == c_before[i * (n + pad) + j]);
  }
}

TEST_CASE("gemm with beta 0 overwrites NaN in c, matrix and vector shapes", "[nn][gemm]") {
  const auto engine = GENERATE(from_range(built_gemm_engines()));
  const auto [m, n] = GENERATE(table<std::size_t, std::size_t>({{5, 4}, {1, 4}, {5, 1}}));
  INFO(nn::to_string(engine) << " m=" << m << " n=" << n);
  const std::size_t k = 3;
  const auto a_values = random_values(m * k, 4);
  const auto b_values = random_values(k * n, 5);
  std::vector<float> c_values(m * n, std::numeric_limits<float>::quiet_NaN());
  nn::detail::gemm(engine, {a_values.data(), m, k}, false, {b_values.data(), k, n}, false, 0.0f,
                   {c_values.data(), m, n});
  for (const float v : c_values)
    REQUIRE(std::isfinite(v));
}

TEST_CASE("gemm with an empty inner dimension writes zeros or keeps c", "[nn][gemm]") {
  const auto engine = GENERATE(from_range(built_gemm_engines()));
  std::vector<float> c_values(6, 5.0f);
  const matrix_view<float> c(c_values.data(), 2, 3);
  const matrix_view<const float> a(c_values.data(), 2, 0, 1), b(c_values.data(), 0, 3, 3);
  nn::detail::gemm(engine, a, false, b, false, 1.0f, c);
  REQUIRE(c(1, 2) == 5.0f);
  nn::detail::gemm(engine, a, false, b, false, 0.0f, c);
  for (const float v : c_values)
    REQUIRE(v == 0.0f);
}

TEST_CASE("GEMM engine names, availability and refusals", "[nn][gemm]") {
  for (const auto e : {nn::gemm_engine::eigen, nn::gemm_engine::onednn, nn::gemm_engine::cblas})
    REQUIRE(nn::parse_gemm_engine(nn::to_string(e)) == e);
  REQUIRE_FALSE(nn::parse_gemm_engine("mkl").has_value());
  REQUIRE(nn::gemm_available(nn::gemm_engine::eigen));
  REQUIRE(nn::gemm_available(nn::default_gemm_engine()));
  REQUIRE(nn::gemm_available(nn::gemm_engine::onednn) == nn::onednn_available);
  REQUIRE(nn::gemm_available(nn::gemm_engine::cblas) == nn::cblas_available);
  nn::parameter_set ps;
  nn::linear layer(ps, 4, 3, "fc");
  REQUIRE(layer.engine() == nn::default_gemm_engine());
  for (const auto e : {nn::gemm_engine::onednn, nn::gemm_engine::cblas}) {
    if (nn::gemm_available(e)) {
      layer.set_engine(e);
      REQUIRE(layer.engine() == e);
    } else {
      REQUIRE_THROWS_WITH(layer.set_engine(e), Catch::Contains("linear::set_engine: GEMM engine '" +
                                                               std::string(nn::to_string(e)) +
                                                               "' is not in this build"));
      models::dlrm::config config;
      config.gemm = e;
      REQUIRE_THROWS_WITH(models::dlrm(config), Catch::Contains("is not in this build"));
    }
  }
}

TEST_CASE("DLRM on every GEMM engine: same logits up to rounding, bitwise across thread counts",
          "[nn][gemm][models]") {
  models::dlrm::config config;
  config.table_rows = {1000};
  const std::size_t batch = 200;  // 4 row blocks, one short
  const auto dense = random_values(batch * config.dense_features, 10);
  std::vector<std::vector<float>> emb;
  std::vector<matrix_view<const float>> emb_views;
  for (std::size_t t = 0; t < config.sparse_features; ++t)
    emb.push_back(random_values(batch * config.embedding_dim, 20 + t));
  for (const auto& e : emb)
    emb_views.emplace_back(e.data(), batch, config.embedding_dim);
  const auto dlogits = random_values(batch, 11);

  /// Logits and dense gradients of one forward + backward with `threads` threads.
  const auto run = [&](nn::gemm_engine engine, int threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism,
                              static_cast<std::size_t>(threads));
    config.gemm = engine;
    models::dlrm model(config);
    std::vector<float> logits(batch);
    model.forward({{dense.data(), batch, config.dense_features}, emb_views}, logits);
    std::vector<std::vector<float>> emb_grad(config.sparse_features,
                                             std::vector<float>(batch * config.embedding_dim));
    std::vector<matrix_view<float>> grad_views;
    for (auto& g : emb_grad)
      grad_views.emplace_back(g.data(), batch, config.embedding_dim);
    model.backward(dlogits, grad_views);
    std::vector<float> out = logits;
    out.insert(out.end(), model.gradients().begin(), model.gradients().end());
    for (const auto& g : emb_grad)
      out.insert(out.end(), g.begin(), g.end());
    return out;
  };
  const auto reference = run(nn::gemm_engine::eigen, 1);
  for (const auto engine : built_gemm_engines()) {
    INFO("engine " << nn::to_string(engine));
    const auto one = run(engine, 1);
    const auto two = run(engine, 2);
    REQUIRE(one == two);  // bitwise
    REQUIRE(one.size() == reference.size());
    // Across engines only the logits are compared (relative L2 norm, rounding level): the
    // gradients of a ReLU network are not continuous in rounding — a pre-activation within
    // rounding of 0 passes the ReLU on one engine and not on another, and the backward mask
    // then moves whole terms (measured: 0.3% of the dense gradients' norm at -O0). Each
    // engine's gradients are checked against float64 by the linear and gemm tests.
    double diff = 0, norm = 0;
    for (std::size_t i = 0; i < batch; ++i) {
      diff += (double(one[i]) - reference[i]) * (double(one[i]) - reference[i]);
      norm += double(reference[i]) * reference[i];
    }
    REQUIRE(std::sqrt(diff) <= 1e-5 * std::sqrt(norm));
  }
}

TEST_CASE("the default GEMM engine avoids an OpenBLAS kernel older than the CPU", "[nn][gemm]") {
  using nn::gemm_engine;
  using nn::detail::choose_gemm_engine;
  using nn::detail::openblas_core_suits_cpu;
  // OpenBLAS's AVX2 / AVX-512 kernels suit an AVX2 CPU, in any letter case; older ones do not.
  for (const char* core : {"Haswell", "Zen", "SkylakeX", "COOPERLAKE", "sapphirerapids"})
    REQUIRE(openblas_core_suits_cpu(core, true));
  for (const char* core : {"Prescott", "Core2", "Nehalem", "Sandybridge", "Haswel", ""})
    REQUIRE_FALSE(openblas_core_suits_cpu(core, true));
  REQUIRE(openblas_core_suits_cpu("Prescott", false));  // a CPU without AVX2: its own kernel
  // The rule: CBLAS unless OpenBLAS fell back; then oneDNN, then Eigen — with a reason.
  REQUIRE(choose_gemm_engine(true, true, "Haswell", true).engine == gemm_engine::cblas);
  REQUIRE(choose_gemm_engine(true, false, "", true).engine == gemm_engine::cblas);
  const auto fallback = choose_gemm_engine(true, true, "Prescott", true);
  REQUIRE(fallback.engine == gemm_engine::onednn);
  REQUIRE_THAT(fallback.reason,
               Catch::Contains("Prescott") && Catch::Contains("OPENBLAS_CORETYPE"));
  REQUIRE(choose_gemm_engine(true, false, "Prescott", true).engine == gemm_engine::eigen);
  REQUIRE(choose_gemm_engine(false, true, "", true).engine == gemm_engine::onednn);
  REQUIRE(choose_gemm_engine(false, false, "", true).engine == gemm_engine::eigen);
  // This process's choice follows the same rule, is available and has a reason.
  const auto& chosen = nn::default_gemm_choice();
  REQUIRE(nn::gemm_available(chosen.engine));
  REQUIRE_FALSE(chosen.reason.empty());
  REQUIRE(&chosen == &nn::default_gemm_choice());
}

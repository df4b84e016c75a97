#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include <tbb/global_control.h>

#include "strata/core/rng.hpp"
#include "strata/models.hpp"
#include "strata/nn/loss.hpp"

#include "models/support.hpp"

using namespace strata;

using namespace model_test;

namespace {
/// float64 Wide & Deep: mean BCE for params p and embedded rows e (per table).
double wd_loss_ref(const models::wide_deep& m, const std::vector<double>& p,
                   const std::vector<std::vector<double>>& e, const batch_data& b) {
  const auto& c = m.get_config();
  const std::size_t F = c.sparse_features, D = c.dense_features, d = c.deep_dim;
  std::vector<double> x;
  for (std::size_t r = 0; r < b.rows; ++r) {
    for (std::size_t k = 0; k < D; ++k)
      x.push_back(b.dense[r * D + k]);
    for (std::size_t f = 0; f < F; ++f)
      for (std::size_t k = 0; k < d; ++k)
        x.push_back(e[F + f][r * d + k]);
  }
  const auto deep = mlp_ref(m.parameter_blocks(), p, "deep", x, b.rows, false);
  double loss = 0;
  for (std::size_t r = 0; r < b.rows; ++r) {
    double l = deep[r] + p[0];
    for (std::size_t f = 0; f < F; ++f)
      l += e[f][r];
    const double y = b.labels[r];
    loss += std::max(l, 0.0) - l * y + std::log1p(std::exp(-std::abs(l)));
  }
  return loss / static_cast<double>(b.rows);
}

models::wide_deep::config small_config() {
  models::wide_deep::config c;
  c.sparse_features = 3;
  c.dense_features = 2;
  c.deep_dim = 3;
  c.table_rows = {50, 60, 70};
  c.deep_mlp = {5, 4, 1};
  c.seed = 5;
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

static_assert(models::ctr_model<models::wide_deep>);

TEST_CASE("wide_deep lists F wide tables of dim 1, then F deep tables", "[models][wide_deep]") {
  const models::wide_deep m(small_config());
  const auto t = m.tables();
  REQUIRE(t.size() == 6);
  REQUIRE(models::wide_deep::wide_tables_first == 0);
  REQUIRE(m.wide_table_count() == 3);
  for (std::size_t f = 0; f < 3; ++f) {
    REQUIRE(t[f].name == "wide_" + std::to_string(f));
    REQUIRE(t[f].dim == 1);
    REQUIRE(m.is_wide(f));
    REQUIRE(t[3 + f].name == "deep_" + std::to_string(f));
    REQUIRE(t[3 + f].dim == 3);
    REQUIRE(!m.is_wide(3 + f));
    REQUIRE(t[f].rows == t[3 + f].rows);
  }
  REQUIRE(t[1].rows == 60);
  REQUIRE(m.parameter_blocks().blocks()[0].name == "wide.bias");
  REQUIRE(m.parameters().size() == 1 + (2 + 9) * 5 + 5 + 5 * 4 + 4 + 4 + 1);
}

TEST_CASE("wide_deep gradients match float64 finite differences", "[models][wide_deep]") {
  models::wide_deep m(small_config());
  // A non-zero wide bias so its use in the logit is checked.
  m.parameters()[0] = 0.3f;
  const batch_data b(5, 2, m.tables(), 200);
  std::vector<std::vector<float>> eg;
  const double loss = train_step(m, b, eg, b.rows);
  std::vector<double> p(m.parameters().begin(), m.parameters().end());
  std::vector<std::vector<double>> e;
  for (const auto& v : b.emb)
    e.emplace_back(v.begin(), v.end());
  REQUIRE(loss / b.rows == Approx(wd_loss_ref(m, p, e, b)).epsilon(1e-5));
  require_close(
      m.gradients(),
      numeric_grad([&](const std::vector<double>& q) { return wd_loss_ref(m, q, e, b); }, p), 2e-4,
      "dparams");
  for (std::size_t t = 0; t < e.size(); ++t) {
    const auto ge = numeric_grad(
        [&](const std::vector<double>& q) {
          auto e2 = e;
          e2[t] = q;
          return wd_loss_ref(m, p, e2, b);
        },
        e[t]);
    require_close(eg[t], ge, 2e-4, "dembedding");
  }
}

TEST_CASE("wide_deep is deterministic across thread counts and batch splits",
          "[models][wide_deep]") {
  auto c = small_config();
  c.deep_mlp = {100, 1};
  models::wide_deep a(c), b(c);
  const batch_data data(600, c.dense_features, a.tables(), 300);
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

  // Two halves with scale 1/600 sum to the full-batch gradient.
  std::vector<double> sum(a.gradients().size(), 0.0);
  for (std::size_t h = 0; h < 2; ++h) {
    batch_data part = data;
    part.rows = 300;
    part.dense.assign(
        data.dense.begin() + static_cast<std::ptrdiff_t>(h * 300 * c.dense_features),
        data.dense.begin() + static_cast<std::ptrdiff_t>((h + 1) * 300 * c.dense_features));
    part.labels.assign(data.labels.begin() + static_cast<std::ptrdiff_t>(h * 300),
                       data.labels.begin() + static_cast<std::ptrdiff_t>((h + 1) * 300));
    const auto tables = a.tables();
    for (std::size_t t = 0; t < tables.size(); ++t) {
      const std::size_t d = tables[t].dim;
      part.emb[t].assign(data.emb[t].begin() + static_cast<std::ptrdiff_t>(h * 300 * d),
                         data.emb[t].begin() + static_cast<std::ptrdiff_t>((h + 1) * 300 * d));
      part.views[t] = matrix_view<const float>(part.emb[t].data(), 300, d);
    }
    std::vector<std::vector<float>> eg;
    train_step(b, part, eg, 600);
    for (std::size_t i = 0; i < sum.size(); ++i)
      sum[i] += b.gradients()[i];
  }
  for (std::size_t i = 0; i < sum.size(); ++i)
    REQUIRE(std::abs(a.gradients()[i] - sum[i]) <= 1e-5);
}

TEST_CASE("wide_deep rejects bad configs and inputs", "[models][wide_deep]") {
  auto c = small_config();
  c.deep_mlp = {4, 2};
  REQUIRE_THROWS_WITH(models::wide_deep(c), Catch::Contains("deep MLP must end in 1 output"));
  c = small_config();
  c.table_rows = {1, 2};
  REQUIRE_THROWS_WITH(models::wide_deep(c), Catch::Contains("table_rows has 2 entries for 3"));
  models::wide_deep m(small_config());
  const batch_data b(4, 2, m.tables(), 9);
  std::vector<float> logits(4);
  auto views = b.views;
  views[0] = matrix_view<const float>(b.emb[3].data(), 4, 3);
  auto in = b.inputs(2);
  in.embedded = views;
  REQUIRE_THROWS_WITH(
      m.forward(in, logits),
      Catch::Contains("embedding input of table 0 'wide_0' is 4 x 3 but must be 4 x 1"));
  in = b.inputs(2);
  in.dense = matrix_view<const float>(b.dense.data(), 2, 4);
  REQUIRE_THROWS_WITH(m.forward(in, logits), Catch::Contains("dense input has 4 features"));
  std::vector<float> dl(4);
  REQUIRE_THROWS_WITH(m.backward(dl, {}), Catch::Contains("before forward"));
}

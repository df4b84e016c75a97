/// @file support.hpp
/// Shared by the model tests: random inputs, a batch holder and float64 reference layers.
#pragma once

#include <cmath>
#include <functional>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/models.hpp"
#include "strata/nn/loss.hpp"

namespace model_test {

using namespace strata;

std::vector<float> random_values(std::size_t n, std::uint64_t stream, float lo = -1.0f,
                                 float hi = 1.0f) {
  const counter_rng rng{7, stream};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = rng.uniform(i, lo, hi);
  return v;
}

/// One batch for a model: dense, embedded rows per table, labels.
struct batch_data {
  std::size_t rows = 0;
  std::vector<float> dense, labels;
  std::vector<std::vector<float>> emb;
  std::vector<matrix_view<const float>> views;
  batch_data(std::size_t b, std::size_t dense_features, const std::vector<embedding::table_spec>& t,
             std::uint64_t stream)
      : rows(b), dense(random_values(b * dense_features, stream)) {
    labels = random_values(b, stream + 1, 0.0f, 1.0f);
    for (auto& l : labels)
      l = l < 0.5f ? 0.0f : 1.0f;
    for (std::size_t k = 0; k < t.size(); ++k)
      emb.push_back(random_values(b * t[k].dim, stream + 10 + k, -0.5f, 0.5f));
    for (std::size_t k = 0; k < t.size(); ++k)
      views.emplace_back(emb[k].data(), b, t[k].dim);
  }
  models::ctr_inputs inputs(std::size_t dense_features) const {
    return {{dense.data(), rows, dense_features}, views};
  }
};

/// Runs forward + mean BCE (scale 1/scale_batch) + backward; returns loss, fills grads.
template <class Model>
double train_step(Model& m, const batch_data& b, std::vector<std::vector<float>>& emb_grads,
                  std::size_t scale_batch) {
  const auto tables = m.tables();
  std::vector<float> logits(b.rows), dl(b.rows);
  m.forward(b.inputs(m.dense_features()), logits);
  const double loss = nn::bce_with_logits(
      logits, b.labels, dl, 1.0f / static_cast<float>(scale_batch), nn::reduction::sum);
  emb_grads.assign(tables.size(), {});
  std::vector<matrix_view<float>> gv;
  for (std::size_t t = 0; t < tables.size(); ++t) {
    emb_grads[t].assign(b.rows * tables[t].dim, 0.0f);
    gv.emplace_back(emb_grads[t].data(), b.rows, tables[t].dim);
  }
  m.backward(dl, gv);
  return loss;
}

std::vector<double> numeric_grad(const std::function<double(const std::vector<double>&)>& f,
                                 std::vector<double> x, double h = 1e-6) {
  std::vector<double> g(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double keep = x[i];
    x[i] = keep + h;
    const double up = f(x);
    x[i] = keep - h;
    const double down = f(x);
    x[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

std::vector<double> mlp_ref(const nn::parameter_set& ps, const std::vector<double>& p,
                            const std::string& name, std::vector<double> h, std::size_t rows,
                            bool relu_last) {
  std::vector<const nn::param_block*> ws, bs;
  for (const auto& b : ps.blocks()) {
    if (b.name.rfind(name + ".", 0) != 0) continue;
    (b.name.ends_with(".weight") ? ws : bs).push_back(&b);
  }
  for (std::size_t l = 0; l < ws.size(); ++l) {
    const std::size_t out = bs[l]->size, in = ws[l]->size / out;
    std::vector<double> y(rows * out);
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t o = 0; o < out; ++o) {
        double s = p[bs[l]->offset + o];
        for (std::size_t i = 0; i < in; ++i)
          s += h[r * in + i] * p[ws[l]->offset + o * in + i];
        y[r * out + o] = (l + 1 < ws.size() || relu_last) ? std::max(s, 0.0) : s;
      }
    h = std::move(y);
  }
  return h;
}

}  // namespace model_test

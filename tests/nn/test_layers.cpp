#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <vector>

#include <tbb/global_control.h>

#include "strata/core/rng.hpp"
#include "strata/nn.hpp"

using namespace strata;

namespace {

std::vector<float> random_values(std::size_t n, std::uint64_t stream, float lo = -1.0f,
                                 float hi = 1.0f) {
  const counter_rng rng{42, stream};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = rng.uniform(i, lo, hi);
  return v;
}

std::vector<double> to_double(std::span<const float> v) {
  return {v.begin(), v.end()};
}

/// Central differences of f at x (float64).
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

void require_close(std::span<const float> got, const std::vector<double>& want, double tol,
                   const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(what << "[" << i << "] got " << got[i] << " want " << want[i]);
    REQUIRE(std::abs(got[i] - want[i]) <= tol * (1.0 + std::abs(want[i])));
  }
}

/// Double reference of linear + optional relu: returns y (rows × out).
std::vector<double> ref_linear(const std::vector<double>& x, const std::vector<double>& w,
                               const std::vector<double>& b, std::size_t rows, std::size_t in,
                               std::size_t out, bool relu_out) {
  std::vector<double> y(rows * out);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t o = 0; o < out; ++o) {
      double s = b[o];
      for (std::size_t i = 0; i < in; ++i)
        s += x[r * in + i] * w[o * in + i];
      y[r * out + o] = relu_out ? std::max(s, 0.0) : s;
    }
  return y;
}

/// The GEMM engines this build has (Eigen always).
std::vector<nn::gemm_engine> built_gemm_engines() {
  std::vector<nn::gemm_engine> engines;
  for (const auto e : {nn::gemm_engine::eigen, nn::gemm_engine::onednn, nn::gemm_engine::cblas})
    if (nn::gemm_available(e)) engines.push_back(e);
  return engines;
}

double dot(const std::vector<double>& a, const std::vector<float>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    s += a[i] * b[i];
  return s;
}

}  // namespace

TEST_CASE("linear forward and backward match float64 finite differences", "[nn][linear]") {
  const auto engine = GENERATE(from_range(built_gemm_engines()));
  INFO("GEMM engine " << nn::to_string(engine));
  const std::size_t rows = 5, in = 7, out = 3;
  nn::parameter_set ps;
  nn::linear layer(ps, in, out, "fc");
  layer.set_engine(engine);
  ps.allocate(7);
  auto x = random_values(rows * in, 1);
  auto r = random_values(rows * out, 2);  // L = Σ r ⊙ y
  matrix<float> y(rows, out), dx(rows, in);
  layer.forward(ps.values(), matrix_view<const float>(x.data(), rows, in), y);

  const auto p = to_double(ps.values());
  const std::vector<double> w(p.begin(), p.begin() + in * out), b(p.begin() + in * out, p.end());
  const auto y_ref = ref_linear(to_double(x), w, b, rows, in, out, false);
  require_close(y.flat(), y_ref, 1e-5, "y");

  layer.backward(ps.values(), matrix_view<const float>(x.data(), rows, in),
                 matrix_view<const float>(r.data(), rows, out), ps.grads(), dx);
  const auto loss_params = [&](const std::vector<double>& q) {
    return dot(ref_linear(to_double(x), {q.begin(), q.begin() + in * out},
                          {q.begin() + in * out, q.end()}, rows, in, out, false),
               r);
  };
  require_close(ps.grads(), numeric_grad(loss_params, p), 1e-4, "dparams");
  const auto loss_x = [&](const std::vector<double>& q) {
    return dot(ref_linear(q, w, b, rows, in, out, false), r);
  };
  require_close(dx.flat(), numeric_grad(loss_x, to_double(x)), 1e-4, "dx");

  SECTION("fused relu forward and through_relu input gradient") {
    layer.forward(ps.values(), matrix_view<const float>(x.data(), rows, in), y,
                  nn::activation::relu);
    require_close(y.flat(), ref_linear(to_double(x), w, b, rows, in, out, true), 1e-5, "relu y");
    // x2 = relu output fed to the next layer: dx2 is masked where x2 == 0.
    std::vector<float> x2(x);
    for (auto& v : x2)
      v = std::max(v, 0.0f);
    layer.backward(ps.values(), matrix_view<const float>(x2.data(), rows, in),
                   matrix_view<const float>(r.data(), rows, out), ps.grads(), dx,
                   nn::input_grad::through_relu);
    const auto loss_pre = [&](const std::vector<double>& q) {  // q = pre-relu input
      std::vector<double> post(q);
      for (auto& v : post)
        v = std::max(v, 0.0);
      return dot(ref_linear(post, w, b, rows, in, out, false), r);
    };
    require_close(dx.flat(), numeric_grad(loss_pre, to_double(x)), 1e-4, "dx through relu");
  }
}

TEST_CASE("linear on a parallel-size batch equals row-by-row results", "[nn][linear]") {
  const auto engine = GENERATE(from_range(built_gemm_engines()));
  INFO("GEMM engine " << nn::to_string(engine));
  const std::size_t rows = 300, in = 20, out = 70;  // 2 dW chunks, 5 row blocks
  nn::parameter_set ps;
  nn::linear layer(ps, in, out, "fc");
  layer.set_engine(engine);
  ps.allocate(3);
  const auto x = random_values(rows * in, 5);
  const auto dy = random_values(rows * out, 6);
  const matrix_view<const float> xv(x.data(), rows, in), dyv(dy.data(), rows, out);
  matrix<float> y(rows, out), dx(rows, in);
  layer.forward(ps.values(), xv, y);
  layer.backward(ps.values(), xv, dyv, ps.grads(), dx);
  const std::vector<float> dparams(ps.grads().begin(), ps.grads().end());

  // Reference: each row alone (sequential path), dW/db summed in float64.
  std::vector<double> dparams_ref(ps.size(), 0.0);
  matrix<float> y1(1, out), dx1(1, in);
  std::vector<float> g1(ps.size());
  for (std::size_t r = 0; r < rows; ++r) {
    layer.forward(ps.values(), xv.rows_slice(r, 1), y1);
    layer.backward(ps.values(), xv.rows_slice(r, 1), dyv.rows_slice(r, 1), g1, dx1);
    for (std::size_t c = 0; c < out; ++c)
      REQUIRE(y(r, c) == Approx(y1(0, c)).margin(1e-5));
    for (std::size_t c = 0; c < in; ++c)
      REQUIRE(dx(r, c) == Approx(dx1(0, c)).margin(1e-5));
    for (std::size_t i = 0; i < g1.size(); ++i)
      dparams_ref[i] += g1[i];
  }
  require_close(dparams, dparams_ref, 1e-5, "dparams");
}

TEST_CASE("linear rejects wrong shapes with clear errors", "[nn][linear]") {
  nn::parameter_set ps;
  nn::linear layer(ps, 4, 3, "fc");
  ps.allocate(1);
  matrix<float> x(2, 5), y(2, 3), y_bad(3, 3), dx(2, 4);
  REQUIRE_THROWS_WITH(layer.forward(ps.values(), x, y),
                      Catch::Contains("linear::forward: x is 2 x 5 but must be 2 x 4"));
  matrix<float> x4(2, 4);
  REQUIRE_THROWS_WITH(layer.forward(ps.values(), x4, y_bad),
                      Catch::Contains("y is 3 x 3 but must be 2 x 3"));
  REQUIRE_THROWS_WITH(layer.backward(ps.values(), x4, y_bad, ps.grads(), dx),
                      Catch::Contains("dy is 3 x 3"));
  std::vector<float> small(5);
  REQUIRE_THROWS_WITH(layer.forward(small, x4, y), Catch::Contains("too small"));
  REQUIRE_THROWS_WITH(nn::linear(ps, 0, 3, "z"), Catch::Contains("sizes must be positive"));
}

TEST_CASE("relu and sigmoid match finite differences", "[nn][activations]") {
  const std::size_t rows = 4, cols = 6;
  auto x = random_values(rows * cols, 9, -3.0f, 3.0f);
  x[0] = 100.0f;
  x[1] = -100.0f;
  const auto r = random_values(rows * cols, 10);
  const matrix_view<const float> xv(x.data(), rows, cols), rv(r.data(), rows, cols);
  matrix<float> y(rows, cols), dx(rows, cols);

  nn::relu::forward(xv, y);
  nn::relu::backward(y, rv, dx);
  const auto relu_loss = [&](const std::vector<double>& q) {
    double s = 0;
    for (std::size_t i = 0; i < q.size(); ++i)
      s += std::max(q[i], 0.0) * r[i];
    return s;
  };
  for (std::size_t i = 0; i < x.size(); ++i)
    REQUIRE(y.flat()[i] == std::max(x[i], 0.0f));
  require_close(dx.flat(), numeric_grad(relu_loss, to_double(x)), 1e-6, "relu dx");

  nn::sigmoid::forward(xv, y);
  nn::sigmoid::backward(y, rv, dx);
  const auto sig_loss = [&](const std::vector<double>& q) {
    double s = 0;
    for (std::size_t i = 0; i < q.size(); ++i)
      s += r[i] / (1.0 + std::exp(-q[i]));
    return s;
  };
  std::vector<double> y_ref(x.size());
  for (std::size_t i = 0; i < x.size(); ++i)
    y_ref[i] = 1.0 / (1.0 + std::exp(-double{x[i]}));
  require_close(y.flat(), y_ref, 1e-6, "sigmoid");
  require_close(dx.flat(), numeric_grad(sig_loss, to_double(x)), 1e-5, "sigmoid dx");
  REQUIRE(y(0, 0) == 1.0f);
  REQUIRE(y(0, 1) >= 0.0f);
  REQUIRE(std::isfinite(dx(0, 1)));

  matrix<float> wrong(rows, cols + 1);
  REQUIRE_THROWS_WITH(nn::relu::forward(xv, wrong), Catch::Contains("relu::forward: y is 4 x 7"));
  REQUIRE_THROWS_WITH(nn::sigmoid::backward(y, rv, wrong), Catch::Contains("sigmoid::backward"));
}

TEST_CASE("bce_with_logits: value, gradient, scale, stability", "[nn][loss]") {
  const std::vector<float> logits = {-2.0f, 0.5f, 3.0f, 0.0f, 100.0f, -100.0f, 100.0f, -100.0f};
  const std::vector<float> labels = {0.0f, 1.0f, 0.0f, 1.0f, 1.0f, 0.0f, 0.0f, 1.0f};
  std::vector<float> dl(logits.size());
  const float scale = 0.25f;
  const double sum = nn::bce_with_logits(logits, labels, dl, scale, nn::reduction::sum);
  const double mean = nn::bce_with_logits(logits, labels, nn::reduction::mean);
  REQUIRE(std::isfinite(sum));
  REQUIRE(mean == Approx(sum / 8).epsilon(1e-12));
  double ref = 0;
  for (std::size_t i = 0; i < 4; ++i) {  // moderate logits: textbook formula
    const double p = 1.0 / (1.0 + std::exp(-double{logits[i]}));
    ref += -labels[i] * std::log(p) - (1 - labels[i]) * std::log(1 - p);
  }
  ref += 0.0 + 0.0 + 100.0 + 100.0;  // confident right: ≈ 0; confident wrong: |l|
  REQUIRE(sum == Approx(ref).epsilon(1e-6));
  for (std::size_t i = 0; i < logits.size(); ++i) {
    REQUIRE(std::isfinite(dl[i]));
    const auto f = [&](const std::vector<double>& q) {
      const double l = q[0];
      return std::max(l, 0.0) - l * labels[i] + std::log1p(std::exp(-std::abs(l)));
    };
    const double g = numeric_grad(f, {double{logits[i]}})[0];
    REQUIRE(dl[i] == Approx(g * scale).margin(1e-6));
  }
  REQUIRE(dl[6] == Approx(0.25f));
  REQUIRE(dl[7] == Approx(-0.25f));
  REQUIRE_THROWS_WITH(nn::bce_with_logits(logits, std::span(labels).first(3)),
                      Catch::Contains("3 labels for 8 logits"));
  std::vector<float> short_grad(2);
  REQUIRE_THROWS_WITH(nn::bce_with_logits(logits, labels, short_grad, 1.0f),
                      Catch::Contains("dlogits has 2 values"));
}

namespace {
/// Double reference of the interaction output for one sample.
std::vector<double> ref_interaction(const std::vector<double>& t, std::size_t n, std::size_t d) {
  std::vector<double> out(t.begin(), t.begin() + d);
  for (std::size_t i = 1; i < n; ++i)
    for (std::size_t j = 0; j < i; ++j) {
      double s = 0;
      for (std::size_t c = 0; c < d; ++c)
        s += t[i * d + c] * t[j * d + c];
      out.push_back(s);
    }
  return out;
}
}  // namespace

TEST_CASE("interaction matches DLRM's layout and finite differences", "[nn][interaction]") {
  const std::size_t batch = 3, features = 4, d = 5, n = features + 1;
  nn::interaction inter(features, d);
  REQUIRE(inter.output_cols() == d + 10);
  REQUIRE(nn::interaction(26, 16).output_cols() == 367);
  const auto z = random_values(batch * d, 20);
  std::vector<std::vector<float>> e;
  std::vector<matrix_view<const float>> ev;
  std::vector<std::vector<float>> de(features, std::vector<float>(batch * d));
  std::vector<matrix_view<float>> dev;
  for (std::size_t f = 0; f < features; ++f) {
    e.push_back(random_values(batch * d, 21 + f));
    ev.emplace_back(e.back().data(), batch, d);
    dev.emplace_back(de[f].data(), batch, d);
  }
  const matrix_view<const float> zv(z.data(), batch, d);
  matrix<float> out(batch, inter.output_cols()), dz(batch, d);
  inter.forward(zv, ev, out);
  const auto r = random_values(batch * inter.output_cols(), 30);
  inter.backward(zv, ev, matrix_view<const float>(r.data(), batch, inter.output_cols()), dz, dev);

  for (std::size_t s = 0; s < batch; ++s) {
    std::vector<double> t;
    for (std::size_t c = 0; c < d; ++c)
      t.push_back(z[s * d + c]);
    for (std::size_t f = 0; f < features; ++f)
      for (std::size_t c = 0; c < d; ++c)
        t.push_back(e[f][s * d + c]);
    require_close(out.row(s), ref_interaction(t, n, d), 1e-5, "out");
    const std::vector<float> rs(r.begin() + static_cast<std::ptrdiff_t>(s * out.cols()),
                                r.begin() + static_cast<std::ptrdiff_t>((s + 1) * out.cols()));
    const auto g = numeric_grad(
        [&](const std::vector<double>& q) { return dot(ref_interaction(q, n, d), rs); }, t);
    require_close(dz.row(s), {g.begin(), g.begin() + d}, 1e-4, "dz");
    for (std::size_t f = 0; f < features; ++f)
      require_close(dev[f].row(s),
                    {g.begin() + static_cast<std::ptrdiff_t>((f + 1) * d),
                     g.begin() + static_cast<std::ptrdiff_t>((f + 2) * d)},
                    1e-4, "de");
  }

  SECTION("wrong shapes") {
    REQUIRE_THROWS_WITH(inter.forward(zv, std::span(ev).first(3), out),
                        Catch::Contains("number of embedding inputs is 3 but must be 4"));
    matrix<float> bad(batch, 4);
    std::vector<matrix_view<const float>> ev_bad(ev);
    ev_bad[2] = bad;
    REQUIRE_THROWS_WITH(inter.forward(zv, ev_bad, out),
                        Catch::Contains("embedding input 2 is 3 x 4 but must be 3 x 5"));
    REQUIRE_THROWS_WITH(inter.forward(zv, ev, dz), Catch::Contains("output is 3 x 5"));
  }
}

TEST_CASE("interaction on a parallel-size batch equals per-row results", "[nn][interaction]") {
  const std::size_t batch = 260, features = 3, d = 4;
  nn::interaction inter(features, d);
  const auto z = random_values(batch * d, 40);
  std::vector<std::vector<float>> e;
  std::vector<matrix_view<const float>> ev;
  for (std::size_t f = 0; f < features; ++f) {
    e.push_back(random_values(batch * d, 41 + f));
    ev.emplace_back(e.back().data(), batch, d);
  }
  const matrix_view<const float> zv(z.data(), batch, d);
  matrix<float> out(batch, inter.output_cols()), dz(batch, d);
  const auto r = random_values(batch * inter.output_cols(), 50);
  const matrix_view<const float> rv(r.data(), batch, inter.output_cols());
  std::vector<matrix<float>> de(features, matrix<float>(batch, d));
  std::vector<matrix_view<float>> dev(de.begin(), de.end());
  inter.forward(zv, ev, out);
  inter.backward(zv, ev, rv, dz, dev);
  for (std::size_t s = 0; s < batch; s += 37) {
    std::vector<matrix_view<const float>> e1;
    std::vector<matrix<float>> de1(features, matrix<float>(1, d));
    std::vector<matrix_view<float>> dev1(de1.begin(), de1.end());
    for (auto& v : ev)
      e1.push_back(v.rows_slice(s, 1));
    matrix<float> out1(1, inter.output_cols()), dz1(1, d);
    inter.forward(zv.rows_slice(s, 1), e1, out1);
    inter.backward(zv.rows_slice(s, 1), e1, rv.rows_slice(s, 1), dz1, dev1);
    for (std::size_t c = 0; c < out.cols(); ++c)
      REQUIRE(out(s, c) == Approx(out1(0, c)).margin(1e-6));
    for (std::size_t c = 0; c < d; ++c) {
      REQUIRE(dz(s, c) == Approx(dz1(0, c)).margin(1e-6));
      for (std::size_t f = 0; f < features; ++f)
        REQUIRE(de[f](s, c) == Approx(de1[f](0, c)).margin(1e-6));
    }
  }
}

TEST_CASE("concat forward/backward round-trip and skipped parts", "[nn][concat]") {
  const std::size_t batch = 3;
  const auto a = random_values(batch * 2, 60), b = random_values(batch * 3, 61);
  const std::vector<matrix_view<const float>> parts = {{a.data(), batch, 2}, {b.data(), batch, 3}};
  matrix<float> out(batch, 5);
  nn::concat::forward(parts, out);
  for (std::size_t r = 0; r < batch; ++r) {
    REQUIRE(out(r, 0) == a[r * 2]);
    REQUIRE(out(r, 1) == a[r * 2 + 1]);
    for (std::size_t c = 0; c < 3; ++c)
      REQUIRE(out(r, 2 + c) == b[r * 3 + c]);
  }
  // backward is the exact adjoint: gradient of Σ R ⊙ out w.r.t. b is R's columns 2..4.
  const auto rg = random_values(batch * 5, 62);
  matrix<float> db(batch, 3);
  const std::vector<matrix_view<float>> dparts = {{nullptr, 0, 2}, db};
  nn::concat::backward(matrix_view<const float>(rg.data(), batch, 5), dparts);
  for (std::size_t r = 0; r < batch; ++r)
    for (std::size_t c = 0; c < 3; ++c)
      REQUIRE(db(r, c) == rg[r * 5 + 2 + c]);

  matrix<float> wrong(batch, 4);
  REQUIRE_THROWS_WITH(nn::concat::forward(parts, wrong),
                      Catch::Contains("output columns is 4 but must be 5"));
  matrix<float> short_rows(2, 5);
  REQUIRE_THROWS_WITH(nn::concat::forward(parts, short_rows),
                      Catch::Contains("part 0 has 3 rows but the output has 2"));
}

TEST_CASE("mlp matches a float64 reference by finite differences", "[nn][mlp]") {
  const std::size_t rows = 4;
  const std::vector<std::size_t> sizes = {3, 6, 5, 2};
  for (const bool relu_last : {false, true}) {
    nn::parameter_set ps;
    nn::mlp net(ps, sizes, relu_last, "net");
    ps.allocate(11);
    const auto x = random_values(rows * 3, 70);
    const auto r = random_values(rows * 2, 71);
    const auto out = net.forward(ps.values(), matrix_view<const float>(x.data(), rows, 3));
    matrix<float> dx(rows, 3);
    net.backward(ps.values(), matrix_view<const float>(r.data(), rows, 2), ps.grads(), dx);
    const auto ref = [&](const std::vector<double>& p, const std::vector<double>& in) {
      std::vector<double> h = in;
      std::size_t off = 0;
      for (std::size_t l = 0; l + 1 < sizes.size(); ++l) {
        const std::size_t i = sizes[l], o = sizes[l + 1];
        const std::vector<double> w(p.begin() + static_cast<std::ptrdiff_t>(off),
                                    p.begin() + static_cast<std::ptrdiff_t>(off + i * o));
        const std::vector<double> b(p.begin() + static_cast<std::ptrdiff_t>(off + i * o),
                                    p.begin() + static_cast<std::ptrdiff_t>(off + i * o + o));
        off += i * o + o;
        h = ref_linear(h, w, b, rows, i, o, l + 2 < sizes.size() || relu_last);
      }
      return h;
    };
    const auto p = to_double(ps.values());
    require_close(out.flat(), ref(p, to_double(x)), 1e-5, "out");
    require_close(
        ps.grads(),
        numeric_grad([&](const std::vector<double>& q) { return dot(ref(q, to_double(x)), r); }, p),
        1e-4, "dparams");
    require_close(
        dx.flat(),
        numeric_grad([&](const std::vector<double>& q) { return dot(ref(p, q), r); }, to_double(x)),
        1e-4, "dx");
  }
  nn::parameter_set ps;
  nn::mlp net(ps, sizes, false, "net");
  ps.allocate(1);
  matrix<float> dy(2, 2);
  REQUIRE_THROWS_WITH(net.backward(ps.values(), dy, ps.grads()), Catch::Contains("before forward"));
}

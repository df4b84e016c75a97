#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <span>
#include <tuple>
#include <vector>

#include <tbb/global_control.h>

#include "strata/comm/collectives.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/core/rng.hpp"
#include "strata/nn/batch_norm.hpp"
#include "strata/nn/conv2d.hpp"
#include "strata/nn/pooling.hpp"
#include "strata/nn/residual.hpp"
#include "strata/nn/softmax_cross_entropy.hpp"

#include "support/skip.hpp"

using namespace strata;

namespace {

std::vector<float> random_values(std::size_t n, std::uint64_t stream, float lo = -1.0f,
                                 float hi = 1.0f) {
  const counter_rng rng{7, stream};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = rng.uniform(i, lo, hi);
  return v;
}

/// L = Σ r ⊙ y in double.
double project(std::span<const float> y, std::span<const float> r) {
  double s = 0;
  for (std::size_t i = 0; i < y.size(); ++i)
    s += static_cast<double>(y[i]) * r[i];
  return s;
}

/// Checks `analytic` against central differences of `loss` over the values `x` (float32
/// perturbations of size h, the loss in double). With `kinks` (networks with ReLU), a value
/// whose differences at h and h/2 disagree sits next to a ReLU kink, where a difference
/// quotient is meaningless: it is skipped, and at most 10% may be.
void check_gradient(std::span<float> x, std::span<const float> analytic,
                    const std::function<double()>& loss, double h, double tol, const char* what,
                    bool kinks = false) {
  REQUIRE(x.size() == analytic.size());
  const auto difference = [&](std::size_t i, double step) {
    const float keep = x[i];
    x[i] = static_cast<float>(keep + step);
    const double up = loss();
    x[i] = static_cast<float>(keep - step);
    const double down = loss();
    x[i] = keep;
    return (up - down) / (static_cast<double>(static_cast<float>(keep + step)) -
                          static_cast<double>(static_cast<float>(keep - step)));
  };
  std::size_t skipped = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const double numeric = difference(i, h);
    if (kinks) {
      const double half = difference(i, h / 2);
      if (std::abs(half - numeric) > tol * (1.0 + std::abs(numeric))) {
        ++skipped;
        continue;
      }
    }
    if (!(std::abs(analytic[i] - numeric) <= tol * (1.0 + std::abs(numeric))))
      FAIL(what << "[" << i << "] analytic " << analytic[i] << " numeric " << numeric);
  }
  INFO(what << ": " << skipped << " of " << x.size() << " values skipped next to a ReLU kink");
  REQUIRE(skipped * 10 <= x.size());
}

/// Direct float64 convolution of NHWC maps (the reference).
std::vector<double> ref_conv(const std::vector<float>& x, const std::vector<float>& w,
                             const std::vector<float>& b, std::size_t n, nn::map_shape in,
                             nn::map_shape out, nn::window win) {
  std::vector<double> y(n * out.size());
  const auto k = static_cast<long>(win.kernel);
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t oh = 0; oh < out.height; ++oh)
      for (std::size_t ow = 0; ow < out.width; ++ow)
        for (std::size_t o = 0; o < out.channels; ++o) {
          double acc = b.empty() ? 0.0 : b[o];
          for (long kh = 0; kh < k; ++kh)
            for (long kw = 0; kw < k; ++kw) {
              const long ih =
                  static_cast<long>(oh * win.stride) + kh - static_cast<long>(win.padding);
              const long iw =
                  static_cast<long>(ow * win.stride) + kw - static_cast<long>(win.padding);
              if (ih < 0 || iw < 0 || ih >= static_cast<long>(in.height) ||
                  iw >= static_cast<long>(in.width))
                continue;
              for (std::size_t c = 0; c < in.channels; ++c)
                acc += static_cast<double>(w[(o * static_cast<std::size_t>(k * k) +
                                              static_cast<std::size_t>(kh * k + kw)) *
                                                 in.channels +
                                             c]) *
                       x[((s * in.height + static_cast<std::size_t>(ih)) * in.width +
                          static_cast<std::size_t>(iw)) *
                             in.channels +
                         c];
            }
          y[((s * out.height + oh) * out.width + ow) * out.channels + o] = acc;
        }
  return y;
}

/// The engines this build can run: im2col and Winograd always, oneDNN when the build has it.
std::vector<nn::conv_engine> engines() {
  std::vector<nn::conv_engine> all{nn::conv_engine::im2col, nn::conv_engine::winograd};
  if (nn::onednn_available) all.push_back(nn::conv_engine::onednn);
  return all;
}

/// One engine's y, dx and (dW, db) against im2col's: every value within `tolerance` of the
/// largest of its kind.
void require_near_im2col(const std::array<std::vector<float>, 3>& got,
                         const std::array<std::vector<float>, 3>& want, double tolerance,
                         const char* engine) {
  const char* names[] = {"y", "dx", "dW,db"};
  for (std::size_t t = 0; t < 3; ++t) {
    double scale = 0;
    for (const float v : want[t])
      scale = std::max(scale, double(std::abs(v)));
    REQUIRE(got[t].size() == want[t].size());
    for (std::size_t i = 0; i < got[t].size(); ++i)
      if (!(std::abs(double(got[t][i]) - want[t][i]) <= tolerance * scale))
        FAIL(names[t] << "[" << i << "] " << engine << " " << got[t][i] << " im2col "
                      << want[t][i]);
  }
}

}  // namespace

TEST_CASE("conv2d forward equals a direct float64 convolution", "[nn][conv2d]") {
  const std::size_t n = 3;
  const nn::map_shape in{5, 6, 3};
  for (const nn::window win : {nn::window{3, 1, 1}, nn::window{3, 2, 1}, nn::window{3, 1, 0},
                               nn::window{1, 1, 0}, nn::window{5, 2, 2}, nn::window{1, 2, 0}}) {
    for (const auto& [bias, engine] :
         {std::pair{false, nn::conv_engine::im2col}, std::pair{true, nn::conv_engine::im2col},
          std::pair{false, nn::default_conv_engine}, std::pair{true, nn::default_conv_engine}}) {
      nn::parameter_set ps;
      nn::conv2d conv(ps, in, 4, win, bias, "c");
      conv.set_engine(engine);
      ps.allocate(3);
      const auto x = random_values(n * in.size(), 1);
      const auto out = conv.output_shape();
      std::vector<float> y(n * out.size());
      conv.forward(ps.values(), {x.data(), n * in.pixels(), in.channels},
                   {y.data(), n * out.pixels(), out.channels});
      const auto wv = conv.weight(ps.values());
      const std::vector<float> w(wv.data(), wv.data() + wv.size());
      const auto bv = conv.bias(ps.values());
      const auto want = ref_conv(x, w, std::vector<float>(bv.begin(), bv.end()), n, in, out, win);
      INFO("kernel " << win.kernel << " stride " << win.stride << " pad " << win.padding
                     << " engine " << to_string(engine) << " bias " << bias);
      REQUIRE(out.height == (in.height + 2 * win.padding - win.kernel) / win.stride + 1);
      for (std::size_t i = 0; i < y.size(); ++i)
        if (!(y[i] == Approx(want[i]).margin(1e-5)))
          FAIL("y[" << i << "] = " << y[i] << ", reference " << want[i]);
    }
  }
}

TEST_CASE("conv2d backward matches finite differences (stride 1 and 2, padding)", "[nn][conv2d]") {
  const std::size_t n = 2;
  const nn::map_shape in{5, 5, 2};
  for (const auto engine : engines())
    for (const nn::window win : {nn::window{3, 1, 1}, nn::window{3, 2, 1}, nn::window{2, 2, 0}}) {
      INFO("kernel " << win.kernel << " stride " << win.stride << " pad " << win.padding
                     << " engine " << to_string(engine));
      nn::parameter_set ps;
      nn::conv2d conv(ps, in, 3, win, true, "c");
      conv.set_engine(engine);
      ps.allocate(5);
      const auto out = conv.output_shape();
      auto x = random_values(n * in.size(), 2);
      const auto r = random_values(n * out.size(), 3);
      std::vector<float> y(n * out.size()), dx(n * in.size());
      const matrix_view<float> xv(x.data(), n * in.pixels(), in.channels);
      const matrix_view<float> yv(y.data(), n * out.pixels(), out.channels);
      matrix_view<float> dxv(dx.data(), n * in.pixels(), in.channels);
      const auto loss = [&] {
        conv.forward(ps.values(), xv, yv);
        return project(y, r);
      };
      loss();
      conv.backward(ps.values(), xv, {r.data(), n * out.pixels(), out.channels}, ps.grads(), &dxv);
      // Convolution is linear in x and in W: central differences are exact up to rounding.
      check_gradient(x, dx, loss, 1e-2, 2e-3, "dx");
      const std::vector<float> dparams(ps.grads().begin(), ps.grads().end());
      check_gradient(ps.values(), dparams, loss, 1e-2, 2e-3, "dW,db");
    }
}

TEST_CASE("conv2d results do not depend on the thread count", "[nn][conv2d]") {
  const std::size_t n = 40;  // 40 × 196 pixels: several sample chunks
  const nn::map_shape in{14, 14, 8};
  const auto engine = GENERATE(from_range(engines()));
  INFO("engine " << to_string(engine));
  nn::parameter_set ps;
  nn::conv2d conv(ps, in, 16, {3, 1, 1}, false, "c");
  conv.set_engine(engine);
  ps.allocate(9);
  const auto x = random_values(n * in.size(), 4);
  const auto dy = random_values(n * in.pixels() * 16, 5);
  const auto run = [&](std::size_t threads) {
    tbb::global_control limit(tbb::global_control::max_allowed_parallelism, threads);
    std::vector<float> y(n * in.pixels() * 16), dx(n * in.size());
    matrix_view<float> dxv(dx.data(), n * in.pixels(), in.channels);
    conv.forward(ps.values(), {x.data(), n * in.pixels(), 8}, {y.data(), n * in.pixels(), 16});
    conv.backward(ps.values(), {x.data(), n * in.pixels(), 8}, {dy.data(), n * in.pixels(), 16},
                  ps.grads(), &dxv);
    y.insert(y.end(), dx.begin(), dx.end());
    y.insert(y.end(), ps.grads().begin(), ps.grads().end());
    return y;
  };
  REQUIRE(run(1) == run(2));
}

TEST_CASE("conv2d on oneDNN equals the im2col engine (ResNet shapes, chunk tails, bias)",
          "[nn][conv2d][onednn]") {
  if (!nn::onednn_available) {
    strata_test::skip("this build has no oneDNN (libdnnl-dev)");
    return;
  }
  struct layer_case {
    nn::map_shape in;
    std::size_t out_channels;
    nn::window win;
    bool bias;
    std::size_t batch;
  };
  // ResNet-20's shapes (stem, each stage, the two stride-2 transitions) with batches that
  // leave a short last chunk, plus odd sizes, a 5x5 window and a 1x1 stride-2 projection.
  const std::vector<layer_case> cases{
      {{28, 28, 1}, 16, {3, 1, 1}, false, 5},  {{28, 28, 16}, 16, {3, 1, 1}, false, 3},
      {{28, 28, 16}, 32, {3, 2, 1}, false, 3}, {{14, 14, 32}, 32, {3, 1, 1}, false, 13},
      {{14, 14, 32}, 64, {3, 2, 1}, false, 7}, {{7, 7, 64}, 64, {3, 1, 1}, false, 23},
      {{9, 11, 3}, 5, {3, 1, 1}, true, 4},     {{9, 11, 3}, 5, {5, 2, 2}, true, 4},
      {{8, 8, 6}, 12, {1, 2, 0}, true, 9}};
  for (const auto& lc : cases) {
    INFO(lc.in.height << "x" << lc.in.width << "x" << lc.in.channels << " -> " << lc.out_channels
                      << " k" << lc.win.kernel << " s" << lc.win.stride << " p" << lc.win.padding
                      << " bias " << lc.bias << " batch " << lc.batch);
    nn::parameter_set ps;
    nn::conv2d conv(ps, lc.in, lc.out_channels, lc.win, lc.bias, "c");
    ps.allocate(11);
    const auto out = conv.output_shape();
    const std::size_t n = lc.batch;
    const auto x = random_values(n * lc.in.size(), 12);
    const auto dy = random_values(n * out.size(), 13);
    const auto run = [&](nn::conv_engine engine) {
      conv.set_engine(engine);
      std::vector<float> y(n * out.size()), dx(n * lc.in.size());
      matrix_view<float> dxv(dx.data(), n * lc.in.pixels(), lc.in.channels);
      const matrix_view<const float> xv(x.data(), n * lc.in.pixels(), lc.in.channels);
      conv.forward(ps.values(), xv, {y.data(), n * out.pixels(), out.channels});
      conv.backward(ps.values(), xv, {dy.data(), n * out.pixels(), out.channels}, ps.grads(), &dxv);
      return std::array{y, dx, std::vector<float>(ps.grads().begin(), ps.grads().end())};
    };
    const auto want = run(nn::conv_engine::im2col);
    const auto got = run(nn::conv_engine::onednn);
    // A window that stops short of the input's end (negative right padding) runs on im2col.
    const bool short_end =
        (lc.in.height + 2 * lc.win.padding - lc.win.kernel) % lc.win.stride > lc.win.padding;
    REQUIRE(conv.runs_onednn(n) == !short_end);
    require_near_im2col(got, want, 1e-5, "onednn");
    // A copy of the layer computes the same (it builds its own primitives).
    nn::conv2d copy = conv;
    std::vector<float> y2(n * out.size());
    copy.forward(ps.values(), {x.data(), n * lc.in.pixels(), lc.in.channels},
                 {y2.data(), n * out.pixels(), out.channels});
    REQUIRE(y2 == got[0]);
  }
}

TEST_CASE("conv2d on Winograd equals the im2col engine (ResNet shapes, tails, odd sizes)",
          "[nn][conv2d]") {
  struct layer_case {
    nn::map_shape in;
    std::size_t out_channels;
    bool bias;
    std::size_t batch;
  };
  // ResNet-20's 3x3 stride-1 shapes (stem, each stage) with batches that leave a short last
  // chunk; maps whose sides are not multiples of the 4x4 tile (and smaller than one tile);
  // channel counts that are not multiples of the 8-channel vector step.
  const std::vector<layer_case> cases{
      {{28, 28, 1}, 16, false, 5}, {{28, 28, 16}, 16, false, 3}, {{14, 14, 32}, 32, false, 13},
      {{7, 7, 64}, 64, false, 23}, {{9, 11, 3}, 5, true, 4},     {{13, 5, 12}, 20, true, 3},
      {{1, 1, 9}, 3, true, 2},     {{2, 3, 8}, 8, false, 3},     {{6, 6, 17}, 9, true, 40}};
  for (const auto& lc : cases) {
    INFO(lc.in.height << "x" << lc.in.width << "x" << lc.in.channels << " -> " << lc.out_channels
                      << " bias " << lc.bias << " batch " << lc.batch);
    nn::parameter_set ps;
    nn::conv2d conv(ps, lc.in, lc.out_channels, {3, 1, 1}, lc.bias, "c");
    ps.allocate(11);
    const auto out = conv.output_shape();
    const std::size_t n = lc.batch;
    const auto x = random_values(n * lc.in.size(), 12);
    const auto dy = random_values(n * out.size(), 13);
    const auto run = [&](nn::conv_engine engine, bool with_dx) {
      conv.set_engine(engine);
      std::vector<float> y(n * out.size()), dx(n * lc.in.size());
      matrix_view<float> dxv(dx.data(), n * lc.in.pixels(), lc.in.channels);
      const matrix_view<const float> xv(x.data(), n * lc.in.pixels(), lc.in.channels);
      conv.forward(ps.values(), xv, {y.data(), n * out.pixels(), out.channels});
      conv.backward(ps.values(), xv, {dy.data(), n * out.pixels(), out.channels}, ps.grads(),
                    with_dx ? &dxv : nullptr);
      return std::array{y, dx, std::vector<float>(ps.grads().begin(), ps.grads().end())};
    };
    const auto want = run(nn::conv_engine::im2col, true);
    const auto got = run(nn::conv_engine::winograd, true);
    REQUIRE(conv.runs_winograd());
    // Winograd's transforms round differently from the direct sum: a few 1e-6 of the largest
    // value on these unit-scale values (measured ≤ 8e-6 on ResNet-20's shapes).
    require_near_im2col(got, want, 2e-5, "winograd");
    // Without dx (the network's first layer) dW and db are the same values.
    const auto no_dx = run(nn::conv_engine::winograd, false);
    REQUIRE(no_dx[2] == got[2]);
    // A copy of the layer computes the same (it starts with its own scratch).
    nn::conv2d copy = conv;
    std::vector<float> y2(n * out.size());
    copy.forward(ps.values(), {x.data(), n * lc.in.pixels(), lc.in.channels},
                 {y2.data(), n * out.pixels(), out.channels});
    REQUIRE(y2 == got[0]);
  }
}

TEST_CASE("conv2d on Winograd: an empty batch gives zero gradients", "[nn][conv2d]") {
  nn::parameter_set ps;
  nn::conv2d conv(ps, {6, 6, 4}, 5, {3, 1, 1}, true, "c");
  ps.allocate(3);
  REQUIRE(conv.runs_winograd());
  std::vector<float> grads(ps.size(), 1.0f), none;
  const matrix_view<const float> empty(none.data(), 0, 4);
  std::vector<float> y;
  conv.forward(ps.values(), empty, {y.data(), 0, 5});
  matrix_view<float> dx(y.data(), 0, 4);
  conv.backward(ps.values(), empty, {none.data(), 0, 5}, grads, &dx);
  REQUIRE(std::ranges::all_of(grads, [](float g) { return g == 0.0f; }));
}

TEST_CASE("conv2d engine choice: names, and oneDNN refused in a build without it", "[nn][conv2d]") {
  nn::parameter_set ps;
  nn::conv2d conv(ps, {4, 4, 2}, 3, {3, 1, 1}, false, "stem");
  CHECK(conv.engine() == nn::default_conv_engine);
  CHECK(nn::default_conv_engine == nn::conv_engine::winograd);
  CHECK(conv.runs_winograd());
  CHECK_FALSE(conv.runs_onednn(2));
  CHECK(to_string(nn::conv_engine::onednn) == "onednn");
  CHECK(to_string(nn::conv_engine::im2col) == "im2col");
  CHECK(to_string(nn::conv_engine::winograd) == "winograd");
  // Windows Winograd does not cover run on oneDNN when the build has it, else on im2col.
  for (const nn::window win : {nn::window{3, 2, 1}, nn::window{3, 1, 0}, nn::window{1, 1, 0}}) {
    nn::conv2d other(ps, {8, 8, 4}, 4, win, false, "other");
    CHECK_FALSE(other.runs_winograd());
    CHECK(other.runs_onednn(2) == nn::onednn_available);
  }
  conv.set_engine(nn::conv_engine::im2col);
  CHECK(conv.engine() == nn::conv_engine::im2col);
  CHECK_FALSE(conv.runs_onednn(2));
  CHECK_FALSE(conv.runs_winograd());
  if (nn::onednn_available) {
    conv.set_engine(nn::conv_engine::onednn);
    CHECK(conv.runs_onednn(2));
  } else {
    REQUIRE_THROWS_WITH(conv.set_engine(nn::conv_engine::onednn),
                        Catch::Contains("stem") && Catch::Contains("libdnnl-dev"));
  }
}

TEST_CASE("conv2d rejects bad shapes with a clear error", "[nn][conv2d]") {
  nn::parameter_set ps;
  nn::conv2d conv(ps, {4, 4, 2}, 3, {3, 1, 1}, false, "c");
  ps.allocate(1);
  std::vector<float> x(2 * 16 * 2), y(2 * 16 * 3), bad(2 * 15 * 2);
  REQUIRE_THROWS_WITH(conv.forward(ps.values(), {bad.data(), 30, 2}, {y.data(), 32, 3}),
                      Catch::Contains("x is 30 x 2") && Catch::Contains("NHWC"));
  REQUIRE_THROWS_WITH(conv.forward(ps.values(), {x.data(), 32, 2}, {y.data(), 16, 3}),
                      Catch::Contains("y holds 1 samples"));
  REQUIRE_THROWS_AS(conv.forward(ps.values(), {x.data(), 16, 4}, {y.data(), 32, 3}), strata::error);
  std::vector<float> small(5);
  REQUIRE_THROWS_WITH(conv.forward(small, {x.data(), 32, 2}, {y.data(), 32, 3}),
                      Catch::Contains("too small"));
  nn::parameter_set ps2;
  REQUIRE_THROWS_WITH(nn::conv2d(ps2, {2, 2, 1}, 3, {5, 1, 1}, false, "big"),
                      Catch::Contains("does not fit"));
  REQUIRE_THROWS_WITH(nn::conv2d(ps2, {4, 4, 1}, 3, {3, 0, 1}, false, "s0"),
                      Catch::Contains("positive"));
}

TEST_CASE("batch_norm training forward normalises and updates running statistics",
          "[nn][batch_norm]") {
  const std::size_t rows = 50, C = 3;
  nn::parameter_set ps;
  nn::batch_norm bn(ps, C, "bn", 0.1f, 1e-5f);
  ps.allocate(1);
  bn.init(ps.values());
  auto x = random_values(rows * C, 6, -2.0f, 3.0f);
  std::vector<float> y(rows * C);
  bn.forward(ps.values(), {x.data(), rows, C}, {y.data(), rows, C}, nn::mode::train);
  for (std::size_t c = 0; c < C; ++c) {
    double mean = 0, var = 0, xm = 0, xv = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      mean += y[r * C + c] / double(rows);
      xm += x[r * C + c] / double(rows);
    }
    for (std::size_t r = 0; r < rows; ++r) {
      var += (y[r * C + c] - mean) * (y[r * C + c] - mean) / double(rows);
      xv += (x[r * C + c] - xm) * (x[r * C + c] - xm) / double(rows - 1);
    }
    REQUIRE(mean == Approx(0.0).margin(1e-5));
    REQUIRE(var == Approx(1.0).epsilon(1e-4));
    REQUIRE(bn.running_mean()[c] == Approx(0.1 * xm).epsilon(1e-5));
    REQUIRE(bn.running_var()[c] == Approx(0.9 + 0.1 * xv).epsilon(1e-5));
  }
  // Eval mode uses the running statistics: y = γ (x − rm)/sqrt(rv + ε) + β.
  bn.gamma(ps.values())[1] = 2.0f;
  bn.beta(ps.values())[1] = -0.5f;
  bn.forward(ps.values(), {x.data(), rows, C}, {y.data(), rows, C}, nn::mode::eval);
  for (std::size_t r = 0; r < rows; ++r) {
    const double want =
        2.0 * (x[r * C + 1] - bn.running_mean()[1]) / std::sqrt(bn.running_var()[1] + 1e-5) - 0.5;
    REQUIRE(y[r * C + 1] == Approx(want).epsilon(1e-5));
  }
  std::vector<float> one(C);
  REQUIRE_THROWS_WITH(
      bn.forward(ps.values(), {one.data(), 1, C}, {one.data(), 1, C}, nn::mode::train),
      Catch::Contains("at least 2"));
  REQUIRE_THROWS_WITH(
      bn.forward(ps.values(), {x.data(), rows, C}, {y.data(), rows / 2, C}, nn::mode::train),
      Catch::Contains("y is 25 x 3"));
}

TEST_CASE("batch_norm backward matches finite differences (train and eval)", "[nn][batch_norm]") {
  const std::size_t rows = 12, C = 2;
  for (const auto m : {nn::mode::train, nn::mode::eval}) {
    INFO((m == nn::mode::train ? "train" : "eval"));
    nn::parameter_set ps;
    nn::batch_norm bn(ps, C, "bn");
    ps.allocate(1);
    bn.init(ps.values());
    bn.gamma(ps.values())[0] = 1.5f;
    bn.beta(ps.values())[1] = 0.3f;
    bn.running_mean()[0] = 0.2f;
    bn.running_var()[1] = 2.0f;
    auto x = random_values(rows * C, 8, -1.0f, 2.0f);
    const auto r = random_values(rows * C, 9);
    std::vector<float> y(rows * C), dx(rows * C);
    const auto loss = [&] {
      const auto keep_m = std::vector<float>(bn.running_mean().begin(), bn.running_mean().end());
      const auto keep_v = std::vector<float>(bn.running_var().begin(), bn.running_var().end());
      bn.forward(ps.values(), {x.data(), rows, C}, {y.data(), rows, C}, m);
      std::ranges::copy(keep_m, bn.running_mean().begin());
      std::ranges::copy(keep_v, bn.running_var().begin());
      return project(y, r);
    };
    loss();
    bn.backward(ps.values(), {x.data(), rows, C}, {r.data(), rows, C}, ps.grads(),
                {dx.data(), rows, C});
    check_gradient(x, dx, loss, 2e-3, 3e-3, "dx");
    const std::vector<float> dparams(ps.grads().begin(), ps.grads().end());
    check_gradient(ps.values(), dparams, loss, 2e-3, 3e-3, "dgamma,dbeta");
  }
}

TEST_CASE("synchronised batch_norm on 2 workers equals one layer on the whole batch",
          "[nn][batch_norm][sync]") {
  const std::size_t rows = 40, C = 3;
  const auto x = random_values(rows * C, 10, -1.0f, 2.0f);
  const auto dy = random_values(rows * C, 11);
  // Reference: one layer on all rows.
  nn::parameter_set ps;
  nn::batch_norm bn(ps, C, "bn");
  ps.allocate(1);
  bn.init(ps.values());
  std::vector<float> y(rows * C), dx(rows * C);
  bn.forward(ps.values(), {x.data(), rows, C}, {y.data(), rows, C}, nn::mode::train);
  bn.backward(ps.values(), {x.data(), rows, C}, {dy.data(), rows, C}, ps.grads(),
              {dx.data(), rows, C});
  const std::vector<float> want_grads(ps.grads().begin(), ps.grads().end());
  const std::vector<float> want_rm(bn.running_mean().begin(), bn.running_mean().end());

  std::vector<float> y2(rows * C), dx2(rows * C);
  std::vector<std::vector<float>> grads(2);
  std::vector<std::vector<float>> rm(2);
  comm::thread_world({2}, {.timeout_seconds = 20}).run([&](comm::thread_transport& t) {
    const std::size_t half = rows / 2, first = static_cast<std::size_t>(t.rank()) * half;
    nn::parameter_set p;
    nn::batch_norm b(p, C, "bn");
    p.allocate(1);
    b.init(p.values());
    const nn::stat_reducer sync = [&t](std::span<double> s) { comm::allreduce(t, s); };
    b.forward(p.values(), {x.data() + first * C, half, C}, {y2.data() + first * C, half, C},
              nn::mode::train, sync);
    b.backward(p.values(), {x.data() + first * C, half, C}, {dy.data() + first * C, half, C},
               p.grads(), {dx2.data() + first * C, half, C}, sync);
    comm::allreduce(t, p.grads());
    grads[static_cast<std::size_t>(t.rank())].assign(p.grads().begin(), p.grads().end());
    rm[static_cast<std::size_t>(t.rank())].assign(b.running_mean().begin(), b.running_mean().end());
  });
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (!(y2[i] == Approx(y[i]).epsilon(1e-5).margin(1e-6)))
      FAIL("y[" << i << "] " << y2[i] << " vs one worker's " << y[i]);
    if (!(dx2[i] == Approx(dx[i]).epsilon(1e-5).margin(1e-6)))
      FAIL("dx[" << i << "] " << dx2[i] << " vs one worker's " << dx[i]);
  }
  for (std::size_t w = 0; w < 2; ++w) {
    for (std::size_t i = 0; i < want_grads.size(); ++i)
      if (!(grads[w][i] == Approx(want_grads[i]).epsilon(1e-5).margin(1e-6)))
        FAIL("worker " << w << " grad[" << i << "] " << grads[w][i] << " vs one worker's "
                       << want_grads[i]);
    for (std::size_t c = 0; c < C; ++c)
      REQUIRE(rm[w][c] == Approx(want_rm[c]).epsilon(1e-5).margin(1e-7));
  }
}

TEST_CASE("max and average pooling: forward vs naive, backward vs finite differences",
          "[nn][pooling]") {
  const std::size_t n = 2;
  const nn::map_shape in{5, 6, 2};
  for (const nn::window win : {nn::window{2, 2, 0}, nn::window{3, 2, 1}, nn::window{3, 1, 1}}) {
    INFO("kernel " << win.kernel << " stride " << win.stride << " pad " << win.padding);
    // Distinct values spaced ≥ 0.05 apart so a ±0.01 step never changes a window's winner.
    std::vector<float> x(n * in.size());
    for (std::size_t i = 0; i < x.size(); ++i)
      x[i] = 0.05f * static_cast<float>((i * 37) % x.size()) - 1.0f;
    nn::max_pool2d mp(in, win);
    nn::avg_pool2d ap(in, win);
    const auto out = mp.output_shape();
    REQUIRE(ap.output_shape() == out);
    const auto r = random_values(n * out.size(), 12);
    std::vector<float> y(n * out.size()), dx(n * in.size());
    const matrix_view<const float> xv(x.data(), n * in.pixels(), in.channels);
    const matrix_view<float> yv(y.data(), n * out.pixels(), out.channels);
    const matrix_view<const float> rv(r.data(), n * out.pixels(), out.channels);
    const matrix_view<float> dxv(dx.data(), n * in.pixels(), in.channels);
    for (const bool is_max : {true, false}) {
      INFO((is_max ? "max" : "avg"));
      const auto loss = [&] {
        if (is_max)
          mp.forward(xv, yv);
        else
          ap.forward(xv, yv);
        return project(y, r);
      };
      loss();
      // Naive forward.
      for (std::size_t s = 0; s < n; ++s)
        for (std::size_t oh = 0; oh < out.height; ++oh)
          for (std::size_t ow = 0; ow < out.width; ++ow)
            for (std::size_t c = 0; c < in.channels; ++c) {
              double best = -1e30, sum = 0;
              for (std::size_t kh = 0; kh < win.kernel; ++kh)
                for (std::size_t kw = 0; kw < win.kernel; ++kw) {
                  const long ih = long(oh * win.stride + kh) - long(win.padding);
                  const long iw = long(ow * win.stride + kw) - long(win.padding);
                  if (ih < 0 || iw < 0 || ih >= long(in.height) || iw >= long(in.width)) continue;
                  const double v =
                      x[((s * in.height + std::size_t(ih)) * in.width + std::size_t(iw)) * 2 + c];
                  best = std::max(best, v);
                  sum += v;
                }
              const double want = is_max ? best : sum / double(win.kernel * win.kernel);
              REQUIRE(y[((s * out.height + oh) * out.width + ow) * 2 + c] ==
                      Approx(want).margin(1e-6));
            }
      if (is_max)
        mp.backward(rv, dxv);
      else
        ap.backward(rv, dxv);
      check_gradient(x, dx, loss, 1e-2, 2e-3, "dx");
    }
  }
  nn::max_pool2d mp(in, {2, 2, 0});
  std::vector<float> big(4 * in.size()), small(4 * 6 * 2);
  mp.forward({big.data(), 4 * in.pixels(), 2}, {small.data(), 4 * 6, 2});
  std::vector<float> dy(2 * 6 * 2), dx(2 * in.size());
  REQUIRE_THROWS_WITH(mp.backward({dy.data(), 12, 2}, {dx.data(), 2 * in.pixels(), 2}),
                      Catch::Contains("last forward"));
  REQUIRE_THROWS_WITH(mp.forward({big.data(), 4 * in.pixels(), 2}, {small.data(), 4 * 6, 1}),
                      Catch::Contains("y is"));
}

TEST_CASE("global average pooling: forward and finite-difference backward", "[nn][pooling]") {
  const std::size_t n = 3;
  const nn::map_shape in{3, 4, 5};
  nn::global_avg_pool gap(in);
  auto x = random_values(n * in.size(), 13);
  const auto r = random_values(n * in.channels, 14);
  std::vector<float> y(n * in.channels), dx(n * in.size());
  const auto loss = [&] {
    gap.forward({x.data(), n * in.pixels(), in.channels}, {y.data(), n, in.channels});
    return project(y, r);
  };
  loss();
  for (std::size_t s = 0; s < n; ++s)
    for (std::size_t c = 0; c < in.channels; ++c) {
      double mean = 0;
      for (std::size_t p = 0; p < in.pixels(); ++p)
        mean += x[(s * in.pixels() + p) * in.channels + c] / double(in.pixels());
      REQUIRE(y[s * in.channels + c] == Approx(mean).margin(1e-6));
    }
  gap.backward({r.data(), n, in.channels}, {dx.data(), n * in.pixels(), in.channels});
  check_gradient(x, dx, loss, 1e-2, 2e-3, "dx");
  REQUIRE_THROWS_WITH(
      gap.forward({x.data(), n * in.pixels(), in.channels}, {y.data(), n - 1, in.channels}),
      Catch::Contains("y is 2 x 5"));
}

TEST_CASE("residual basic block backward matches finite differences", "[nn][residual]") {
  const std::size_t n = 3;
  for (const auto& [in, out_c, stride] :
       {std::tuple{nn::map_shape{4, 4, 2}, std::size_t{2}, std::size_t{1}},
        std::tuple{nn::map_shape{5, 5, 2}, std::size_t{3}, std::size_t{2}}}) {
    INFO("stride " << stride << " channels " << in.channels << " -> " << out_c);
    nn::parameter_set ps;
    nn::basic_block block(ps, in, out_c, stride, "b");
    ps.allocate(11);
    block.init(ps.values());
    // Non-trivial γ, β so every path carries gradient.
    for (std::size_t c = 0; c < out_c; ++c) {
      block.bn1().gamma(ps.values())[c] = 0.8f + 0.2f * float(c);
      block.bn2().beta(ps.values())[c] = 0.1f * float(c);
    }
    const auto out = block.output_shape();
    auto x = random_values(n * in.size(), 15);
    const auto r = random_values(n * out.size(), 16);
    std::vector<float> y(n * out.size()), dx(n * in.size());
    const matrix_view<float> xv(x.data(), n * in.pixels(), in.channels);
    const matrix_view<float> yv(y.data(), n * out.pixels(), out.channels);
    matrix_view<float> dxv(dx.data(), n * in.pixels(), in.channels);
    const auto loss = [&] {
      block.forward(ps.values(), xv, yv, nn::mode::train);
      return project(y, r);
    };
    loss();
    block.backward(ps.values(), xv, yv, {r.data(), n * out.pixels(), out.channels}, ps.grads(),
                   &dxv);
    check_gradient(x, dx, loss, 1e-3, 1e-2, "dx", true);
    const std::vector<float> dparams(ps.grads().begin(), ps.grads().end());
    check_gradient(ps.values(), dparams, loss, 1e-3, 1e-2, "dparams", true);
  }
}

namespace {

/// Fails unless `got` equals `want` value for value (== : +0 and −0 are equal).
void require_equal(std::span<const float> got, std::span<const float> want, const char* what) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < got.size(); ++i)
    if (!(got[i] == want[i])) FAIL(what << "[" << i << "] " << got[i] << " vs " << want[i]);
}

}  // namespace

TEST_CASE("batch_norm's fused ReLU equals the separate passes, value for value",
          "[nn][batch_norm][fused]") {
  // 2600 rows: three 1024-row blocks, the last one short, run in parallel.
  const std::size_t rows = 2600, C = 5;
  for (const auto m : {nn::mode::train, nn::mode::eval}) {
    INFO((m == nn::mode::train ? "train" : "eval"));
    const auto x = random_values(rows * C, 30, -2.0f, 2.0f);
    const auto dy = random_values(rows * C, 31);
    const auto make = [&](nn::parameter_set& ps) {
      nn::batch_norm bn(ps, C, "bn");
      ps.allocate(1);
      bn.init(ps.values());
      for (std::size_t c = 0; c < C; ++c) {
        bn.gamma(ps.values())[c] = 0.5f + 0.25f * float(c);
        bn.beta(ps.values())[c] = 0.2f * float(c) - 0.4f;
        bn.running_mean()[c] = 0.1f * float(c);
      }
      return bn;
    };
    // Reference: BN, then ReLU, then its mask, then BN's backward.
    nn::parameter_set ps_ref;
    auto ref = make(ps_ref);
    std::vector<float> y_ref(rows * C), g(rows * C), dx_ref(rows * C);
    ref.forward(ps_ref.values(), {x.data(), rows, C}, {y_ref.data(), rows, C}, m);
    for (std::size_t i = 0; i < y_ref.size(); ++i) {
      y_ref[i] = std::max(y_ref[i], 0.0f);
      g[i] = y_ref[i] > 0.0f ? dy[i] : 0.0f;
    }
    ref.backward(ps_ref.values(), {x.data(), rows, C}, {g.data(), rows, C}, ps_ref.grads(),
                 {dx_ref.data(), rows, C});
    // Fused: the ReLU inside forward's pass, its mask inside backward's two passes, dx written
    // over dy's own rows.
    nn::parameter_set ps;
    auto bn = make(ps);
    std::vector<float> y(rows * C), d = dy;
    bn.forward(ps.values(), {x.data(), rows, C}, {y.data(), rows, C}, m, {},
               nn::batch_norm::relu_rows);
    const matrix_view<float> dv(d.data(), rows, C);
    bn.backward(ps.values(), {x.data(), rows, C}, bn.relu_gradient({x.data(), rows, C}, dv),
                ps.grads(), dv);
    require_equal(y, y_ref, "y");
    require_equal(d, dx_ref, "dx");
    require_equal(ps.grads(), ps_ref.grads(), "grads");
    require_equal(bn.running_mean(), ref.running_mean(), "running mean");
    require_equal(bn.running_var(), ref.running_var(), "running var");
    // Bad inputs: no forward yet, a gradient of the wrong length, rows another forward did
    // not have.
    nn::parameter_set ps_fresh;
    const auto fresh = make(ps_fresh);
    REQUIRE_THROWS_WITH(fresh.relu_gradient({x.data(), rows, C}, dv),
                        Catch::Contains("call forward first"));
    REQUIRE_THROWS_WITH(bn.relu_gradient({x.data(), rows - 1, C}, dv),
                        Catch::Contains("batch_norm::relu_gradient: x is 2599 x 5"));
    REQUIRE_THROWS_WITH(bn.backward(
                            ps.values(), {x.data(), rows, C},
                            [&](std::size_t first, std::size_t count, float*) {
                              return matrix_view<const float>(dv.rows_slice(first, count - 1));
                            },
                            ps.grads(), dv),
                        Catch::Contains("gradient block"));
  }
}

TEST_CASE("relu_masked equals select for finite gradients (the branch-free mask)",
          "[nn][activations]") {
  Eigen::ArrayXf v(6), g(6);
  v << -1.0f, 0.0f, 2.0f, -0.0f, 1e-30f, -3.0f;
  g << 4.0f, -5.0f, 6.0f, 7.0f, -8.0f, -9.0f;
  const Eigen::ArrayXf got = nn::detail::relu_masked(v, g);
  const Eigen::ArrayXf want = (v > 0.0f).select(g, 0.0f);
  for (Eigen::Index i = 0; i < v.size(); ++i)
    REQUIRE(got[i] == want[i]);
}

TEST_CASE("residual basic block: the fused passes equal the unfused layers, value for value",
          "[nn][residual][fused]") {
  // 40 samples of 8×8 (2560 output rows at stride 1: parallel blocks and sample chunks).
  const std::size_t n = 40;
  for (const auto& [in, out_c, stride] :
       {std::tuple{nn::map_shape{8, 8, 4}, std::size_t{4}, std::size_t{1}},
        std::tuple{nn::map_shape{8, 8, 4}, std::size_t{8}, std::size_t{2}},
        std::tuple{nn::map_shape{7, 7, 3}, std::size_t{5}, std::size_t{2}}}) {
    INFO("stride " << stride << " channels " << in.channels << " -> " << out_c);
    nn::parameter_set ps;
    nn::basic_block block(ps, in, out_c, stride, "b");
    ps.allocate(12);
    block.init(ps.values());
    // The same layers, one pass each, on a parameter set of the same layout.
    nn::parameter_set ps_ref;
    nn::conv2d conv1(ps_ref, in, out_c, {3, stride, 1}, false, "b.conv1");
    nn::batch_norm bn1(ps_ref, out_c, "b.bn1");
    nn::conv2d conv2(ps_ref, conv1.output_shape(), out_c, {3, 1, 1}, false, "b.conv2");
    nn::batch_norm bn2(ps_ref, out_c, "b.bn2");
    const nn::shortcut shortcut(in, out_c, stride);
    ps_ref.allocate(1);
    REQUIRE(ps_ref.size() == ps.size());
    for (std::size_t c = 0; c < out_c; ++c) {
      block.bn1().gamma(ps.values())[c] = 0.8f + 0.2f * float(c);
      block.bn1().beta(ps.values())[c] = 0.05f * float(c) - 0.1f;
      block.bn2().beta(ps.values())[c] = 0.1f * float(c) - 0.2f;
    }
    std::ranges::copy(ps.values(), ps_ref.values().begin());
    const auto out = block.output_shape();
    const std::size_t in_rows = n * in.pixels(), rows = n * out.pixels();
    const auto x = random_values(n * in.size(), 32);
    const auto dy = random_values(n * out.size(), 33);
    const matrix_view<const float> xv(x.data(), in_rows, in.channels);
    const matrix_view<const float> dyv(dy.data(), rows, out_c);

    std::vector<float> c1(rows * out_c), r1(rows * out_c), c2(rows * out_c), y_ref(rows * out_c);
    const std::size_t channels = out_c;  // clang 14 captures no structured binding
    const auto view = [&](std::vector<float>& v) {
      return matrix_view<float>(v.data(), rows, channels);
    };
    const auto relu = [](std::vector<float>& v) {
      for (float& e : v)
        e = std::max(e, 0.0f);
    };
    const auto mask = [](std::vector<float>& g, const std::vector<float>& by) {
      for (std::size_t i = 0; i < g.size(); ++i)
        g[i] = by[i] > 0.0f ? g[i] : 0.0f;
    };
    const auto values = std::span<const float>(ps_ref.values());
    conv1.forward(values, xv, view(c1));
    bn1.forward(values, view(c1), view(r1), nn::mode::train);
    relu(r1);
    conv2.forward(values, view(r1), view(c2));
    bn2.forward(values, view(c2), view(y_ref), nn::mode::train);
    shortcut.add_forward(xv, view(y_ref));
    relu(y_ref);
    std::vector<float> g(dy.begin(), dy.end()), t(rows * out_c), d(rows * out_c),
        dx_ref(in_rows * in.channels);
    mask(g, y_ref);
    bn2.backward(values, view(c2), view(g), ps_ref.grads(), view(t));
    auto dv = view(d);
    conv2.backward(values, view(r1), view(t), ps_ref.grads(), &dv);
    mask(d, r1);
    bn1.backward(values, view(c1), view(d), ps_ref.grads(), view(d));
    matrix_view<float> dx_ref_v(dx_ref.data(), in_rows, in.channels);
    conv1.backward(values, xv, view(d), ps_ref.grads(), &dx_ref_v);
    shortcut.add_backward(view(g), dx_ref_v);

    std::vector<float> y(rows * out_c), dx(in_rows * in.channels);
    matrix_view<float> dxv(dx.data(), in_rows, in.channels);
    block.forward(ps.values(), xv, view(y), nn::mode::train);
    block.backward(ps.values(), xv, view(y), dyv, ps.grads(), &dxv);
    require_equal(y, y_ref, "y");
    require_equal(dx, dx_ref, "dx");
    require_equal(ps.grads(), ps_ref.grads(), "grads");
    require_equal(block.bn1().running_var(), bn1.running_var(), "bn1 running var");
    require_equal(block.bn2().running_mean(), bn2.running_mean(), "bn2 running mean");
  }
}

TEST_CASE("softmax cross-entropy: loss vs float64, gradient vs finite differences",
          "[nn][softmax]") {
  const std::size_t n = 4, k = 5;
  auto z = random_values(n * k, 17, -3.0f, 3.0f);
  z[3] = 80.0f;  // large logit: no overflow
  const std::vector<std::uint8_t> labels = {3, 0, 4, 2};
  std::vector<float> d(n * k);
  const double loss = nn::softmax_cross_entropy<std::uint8_t>({z.data(), n, k}, labels,
                                                              {d.data(), n, k}, 1.0f / float(n));
  double want = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double top = -1e300;
    for (std::size_t c = 0; c < k; ++c)
      top = std::max(top, double(z[i * k + c]));
    double s = 0;
    for (std::size_t c = 0; c < k; ++c)
      s += std::exp(double(z[i * k + c]) - top);
    want += (std::log(s) + top - z[i * k + labels[i]]) / double(n);
  }
  REQUIRE(std::isfinite(loss));
  REQUIRE(loss == Approx(want).epsilon(1e-12));
  const auto f = [&] { return nn::softmax_cross_entropy<std::uint8_t>({z.data(), n, k}, labels); };
  check_gradient(z, d, f, 1e-3, 1e-3, "dlogits");
  REQUIRE(nn::softmax_cross_entropy<std::uint8_t>({z.data(), n, k}, labels, nn::reduction::sum) ==
          Approx(want * n).epsilon(1e-12));
  const std::vector<int> bad = {0, 1, 5, 2};
  REQUIRE_THROWS_WITH(nn::softmax_cross_entropy<int>({z.data(), n, k}, bad),
                      Catch::Contains("label[2] = 5"));
  const std::vector<int> negative = {0, -1, 1, 2};
  REQUIRE_THROWS_AS(nn::softmax_cross_entropy<int>({z.data(), n, k}, negative), strata::error);
  REQUIRE_THROWS_WITH(
      nn::softmax_cross_entropy<std::uint8_t>({z.data(), n, k}, std::span(labels).first(3)),
      Catch::Contains("3 labels for 4 rows"));
  REQUIRE_THROWS_WITH(
      nn::softmax_cross_entropy<std::uint8_t>({z.data(), n, k}, labels, {d.data(), n, k - 1}, 1.0f),
      Catch::Contains("dlogits is 4 x 4"));
}

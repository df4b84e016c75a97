#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/nn/optimizers.hpp"

using namespace strata;

namespace {
std::vector<float> values(std::size_t n, std::uint64_t stream) {
  const counter_rng rng{1, stream};
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = rng.uniform(i, -1.0f, 1.0f);
  return v;
}
template <class Ref>
void check(std::vector<float>& p, std::vector<double>& pd, Ref&& ref_step, auto&& step,
           std::size_t n) {
  for (int s = 0; s < 5; ++s) {
    const auto g = values(n, 100 + static_cast<std::uint64_t>(s));
    step(p, g);
    for (std::size_t i = 0; i < n; ++i)
      ref_step(pd, i, double{g[i]}, s + 1);
  }
  for (std::size_t i = 0; i < n; ++i)
    REQUIRE(p[i] == Approx(pd[i]).margin(1e-5));
}
}  // namespace

TEST_CASE("dense optimizers match a float64 reference", "[nn][optim]") {
  // 70000 > one chunk: also covers the parallel path.
  for (const std::size_t n : {std::size_t{37}, std::size_t{70000}}) {
    auto p0 = values(n, 1);
    SECTION("sgd " + std::to_string(n)) {
      nn::sgd opt{0.1f};
      std::vector<double> pd(p0.begin(), p0.end());
      check(
          p0, pd, [](auto& q, std::size_t i, double g, int) { q[i] -= 0.1 * g; },
          [&](auto& p, const auto& g) { opt.step(p, g); }, n);
    }
    SECTION("adagrad " + std::to_string(n)) {
      nn::adagrad opt{0.05f, 1e-10f};
      std::vector<double> pd(p0.begin(), p0.end()), h(n, 0.0);
      check(
          p0, pd,
          [&](auto& q, std::size_t i, double g, int) {
            h[i] += g * g;
            q[i] -= 0.05 * g / (std::sqrt(h[i]) + 1e-10);
          },
          [&](auto& p, const auto& g) { opt.step(p, g); }, n);
      REQUIRE(opt.state().size() == n);
    }
    SECTION("adam " + std::to_string(n)) {
      nn::adam opt{0.01f, 0.9f, 0.999f, 1e-8f};
      std::vector<double> pd(p0.begin(), p0.end()), m(n, 0.0), v(n, 0.0);
      check(
          p0, pd,
          [&](auto& q, std::size_t i, double g, int t) {
            m[i] = 0.9 * m[i] + 0.1 * g;
            v[i] = 0.999 * v[i] + 0.001 * g * g;
            const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.999, t));
            q[i] -= 0.01 * mh / (std::sqrt(vh) + 1e-8);
          },
          [&](auto& p, const auto& g) { opt.step(p, g); }, n);
      REQUIRE(opt.steps() == 5);
    }
  }
}

TEST_CASE("dense optimizers reject mismatched spans", "[nn][optim]") {
  std::vector<float> p(10), g(9), p2(12), g2(12);
  REQUIRE_THROWS_WITH(nn::sgd{}.step(p, g), Catch::Contains("10 parameters but 9 gradients"));
  nn::adam opt;
  std::vector<float> g10(10);
  opt.step(p, g10);
  REQUIRE_THROWS_WITH(opt.step(p2, g2),
                      Catch::Contains("sized for 10 parameters on its first step but now got 12"));
  nn::adagrad ada;
  ada.step(p, g10);
  REQUIRE_THROWS_AS(ada.step(p2, g2), error);
}

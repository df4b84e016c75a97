#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/optim.hpp"

using namespace strata;
using namespace strata::optim;

namespace {

struct no_apply {  // has name and state_floats but no apply(): not an optimizer
  static constexpr const char* name = "x";
  static std::size_t state_floats(std::size_t) { return 0; }
};

// ---- float64 references, written plainly from the papers' formulas ---------------------------
struct ref_sgd {
  double lr;
  void operator()(std::vector<double>& w, std::vector<double>&, const std::vector<double>& g) {
    for (std::size_t c = 0; c < w.size(); ++c)
      w[c] -= lr * g[c];
  }
};
struct ref_adagrad {
  double lr, eps, init;
  void operator()(std::vector<double>& w, std::vector<double>& s, const std::vector<double>& g) {
    if (s.empty()) s.assign(w.size(), init);  // s = accumulator
    for (std::size_t c = 0; c < w.size(); ++c) {
      s[c] += g[c] * g[c];
      w[c] -= lr * g[c] / (std::sqrt(s[c]) + eps);
    }
  }
};
struct ref_adam {
  double lr, b1, b2, eps;
  void operator()(std::vector<double>& w, std::vector<double>& s, const std::vector<double>& g) {
    const std::size_t d = w.size();
    if (s.empty()) s.assign(2 * d + 1, 0.0);  // m, v, t
    const double t = s[2 * d] += 1;
    for (std::size_t c = 0; c < d; ++c) {
      double& m = s[c];
      double& v = s[d + c];
      m = b1 * m + (1 - b1) * g[c];
      v = b2 * v + (1 - b2) * g[c] * g[c];
      const double mhat = m / (1 - std::pow(b1, t));
      const double vhat = v / (1 - std::pow(b2, t));
      w[c] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
};
struct ref_momentum {
  double lr, beta, decay;
  void operator()(std::vector<double>& w, std::vector<double>& s, const std::vector<double>& g) {
    if (s.empty()) s.assign(w.size(), 0.0);  // s = velocity
    for (std::size_t c = 0; c < w.size(); ++c) {
      s[c] = beta * s[c] + (g[c] + decay * w[c]);
      w[c] -= lr * s[c];
    }
  }
};
struct ref_ftrl {
  double alpha, beta, l1, l2;
  void operator()(std::vector<double>& w, std::vector<double>& s, const std::vector<double>& g) {
    const std::size_t d = w.size();
    if (s.empty()) s.assign(2 * d, 0.0);  // z, n
    for (std::size_t c = 0; c < d; ++c) {
      double& z = s[c];
      double& n = s[d + c];
      const double sigma = (std::sqrt(n + g[c] * g[c]) - std::sqrt(n)) / alpha;
      z += g[c] - sigma * w[c];
      n += g[c] * g[c];
      if (std::abs(z) <= l1)
        w[c] = 0;
      else
        w[c] = -(z - (z > 0 ? l1 : -l1)) / ((beta + std::sqrt(n)) / alpha + l2);
    }
  }
};

/// Trains a tiny table for several steps with duplicate keys and rows skipped in some steps,
/// once with the optimizer under test (float, sum_duplicates + apply_sparse) and once with the
/// float64 reference (naive map-based duplicate sum); compares every weight.
template <class Opt, class Ref>
void check_against_reference(Opt opt, Ref ref, int steps = 8) {
  constexpr std::size_t rows = 7, dim = 5;
  const std::size_t sf = Opt::state_floats(dim);
  std::vector<float> w(rows * dim), state(rows * sf);
  std::vector<std::vector<double>> rw(rows, std::vector<double>(dim)), rs(rows);
  const counter_rng init{11, 1};
  for (std::size_t i = 0; i < rows * dim; ++i) {
    w[i] = init.uniform(i, -0.5f, 0.5f);
    rw[i / dim][i % dim] = w[i];
  }
  sparse_gradient work;
  std::vector<int> touched(rows, 0);
  for (int step = 0; step < steps; ++step) {
    // Keys: row 3 every step (often twice), row 5 only on even steps, row 6 never; others vary.
    std::vector<std::uint64_t> keys{3, static_cast<std::uint64_t>(step % 3), 3};
    if (step % 2 == 0) keys.push_back(5);
    if (step % 3 == 1) keys.push_back(static_cast<std::uint64_t>(step % 3));
    keys.push_back(4 - static_cast<std::uint64_t>(step % 2));
    const counter_rng grng{7, static_cast<std::uint64_t>(step)};
    matrix<float> grads(keys.size(), dim);
    for (std::size_t i = 0; i < grads.size(); ++i)
      grads.flat()[i] = grng.normal(i);

    work.sum_duplicates(keys, grads.view());
    apply_sparse(opt, work.grads(), [&](std::size_t i) {
      const auto k = work.keys()[i];
      return row_ref{std::span(w).subspan(k * dim, dim), std::span(state).subspan(k * sf, sf)};
    });

    std::map<std::uint64_t, std::vector<double>> summed;
    for (std::size_t i = 0; i < keys.size(); ++i) {
      auto& acc = summed[keys[i]];
      acc.resize(dim, 0.0);
      for (std::size_t c = 0; c < dim; ++c)
        acc[c] += grads(i, c);
    }
    for (auto& [k, g] : summed) {
      ref(rw[k], rs[k], g);
      ++touched[k];
    }
    for (std::size_t k = 0; k < rows; ++k)
      for (std::size_t c = 0; c < dim; ++c) {
        INFO(Opt::name << " step " << step << " row " << k << " col " << c);
        REQUIRE(w[k * dim + c] == Approx(rw[k][c]).epsilon(1e-5).margin(1e-6));
      }
  }
  // The untouched row kept its initial value and zero state.
  REQUIRE(touched[6] == 0);
  for (std::size_t c = 0; c < dim; ++c)
    REQUIRE(w[6 * dim + c] == init.uniform(6 * dim + c, -0.5f, 0.5f));
  for (std::size_t c = 0; c < sf; ++c)
    REQUIRE(state[6 * sf + c] == 0.0f);
}

}  // namespace

TEST_CASE("optimizers model sparse_optimizer; other types do not", "[optim]") {
  STATIC_REQUIRE(sparse_optimizer<sgd>);
  STATIC_REQUIRE(sparse_optimizer<adagrad>);
  STATIC_REQUIRE(sparse_optimizer<adam>);
  STATIC_REQUIRE(sparse_optimizer<ftrl>);
  STATIC_REQUIRE_FALSE(sparse_optimizer<int>);
  STATIC_REQUIRE_FALSE(sparse_optimizer<no_apply>);
  REQUIRE(sgd::state_floats(8) == 0);
  REQUIRE(adagrad::state_floats(8) == 8);
  REQUIRE(adam::state_floats(8) == 17);
  REQUIRE(ftrl::state_floats(8) == 16);
}

TEST_CASE("sgd matches a float64 reference", "[optim][sgd]") {
  check_against_reference(sgd{0.1f}, ref_sgd{0.1});
}

TEST_CASE("momentum with weight decay matches a float64 reference", "[optim][momentum]") {
  check_against_reference(momentum{.lr = 0.1f}, ref_momentum{0.1, 0.9, 5e-4});
  check_against_reference(momentum{.lr = 0.05f, .beta = 0.5f, .weight_decay = 0.0f},
                          ref_momentum{0.05, 0.5, 0.0});
}

TEST_CASE("adagrad matches a float64 reference", "[optim][adagrad]") {
  check_against_reference(adagrad{.lr = 0.1f, .eps = 1e-10f}, ref_adagrad{0.1, 1e-10, 0.0});
  check_against_reference(adagrad{.lr = 0.05f, .eps = 1e-6f, .initial_accumulator = 0.1f},
                          ref_adagrad{0.05, 1e-6, 0.1});
}

TEST_CASE("lazy adam matches a float64 reference with per-row step counts", "[optim][adam]") {
  check_against_reference(adam{.lr = 0.01f}, ref_adam{0.01, 0.9, 0.999, 1e-8});
  check_against_reference(adam{.lr = 0.05f, .beta1 = 0.5f, .beta2 = 0.9f, .eps = 1e-6f},
                          ref_adam{0.05, 0.5, 0.9, 1e-6});
}

TEST_CASE("adam keeps each row's own step count in its state", "[optim][adam]") {
  const adam opt{};
  std::vector<float> w(2, 0.0f), s(2 * adam::state_floats(1), 0.0f);
  const std::vector<float> g{1.0f};
  for (int i = 0; i < 3; ++i)
    opt.apply(std::span(w).first(1), std::span(s).first(3), g);
  opt.apply(std::span(w).last(1), std::span(s).last(3), g);
  REQUIRE(s[2] == 3.0f);
  REQUIRE(s[5] == 1.0f);
  // First step with bias correction moves by lr·g/(|g| + eps) ≈ lr.
  REQUIRE(w[1] == Approx(-opt.lr).epsilon(1e-5));
}

TEST_CASE("ftrl matches a float64 reference", "[optim][ftrl]") {
  check_against_reference(ftrl{.alpha = 0.1f, .beta = 1.0f}, ref_ftrl{0.1, 1.0, 0.0, 0.0});
  check_against_reference(ftrl{.alpha = 0.5f, .beta = 0.5f, .l1 = 0.3f, .l2 = 0.2f},
                          ref_ftrl{0.5, 0.5, 0.3, 0.2});
}

TEST_CASE("ftrl with strong L1 drives weights to exactly zero", "[optim][ftrl]") {
  const ftrl opt{.alpha = 0.1f, .beta = 1.0f, .l1 = 100.0f};
  std::vector<float> w{0.3f, -0.2f}, s(4, 0.0f);
  const std::vector<float> g{0.5f, -0.5f};
  opt.apply(w, s, g);
  REQUIRE(w[0] == 0.0f);
  REQUIRE(w[1] == 0.0f);
}

TEST_CASE("apply_sparse in parallel equals the serial result bitwise", "[optim]") {
  const std::size_t rows = 6000, dim = 16;  // large enough for the parallel path
  matrix<float> grads(rows, dim);
  const counter_rng rng{3, 0};
  for (std::size_t i = 0; i < grads.size(); ++i)
    grads.flat()[i] = rng.normal(i);
  const adam opt{};
  const std::size_t sf = adam::state_floats(dim);
  std::vector<float> w1(rows * dim, 0.5f), s1(rows * sf), w2 = w1, s2 = s1;
  for (int step = 0; step < 2; ++step) {
    apply_sparse(opt, grads.view(), [&](std::size_t i) {
      return row_ref{std::span(w1).subspan(i * dim, dim), std::span(s1).subspan(i * sf, sf)};
    });
    for (std::size_t i = 0; i < rows; ++i)
      opt.apply(std::span(w2).subspan(i * dim, dim), std::span(s2).subspan(i * sf, sf),
                grads.row(i));
  }
  REQUIRE(w1 == w2);
  REQUIRE(s1 == s2);
}

TEST_CASE("apply_sparse rejects a row whose width differs from the gradient", "[optim]") {
  matrix<float> grads(1, 4);
  std::vector<float> w(3);
  try {
    apply_sparse(sgd{}, grads.view(), [&](std::size_t) { return row_ref{w, {}}; });
    FAIL("no error");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::size_mismatch);
    REQUIRE_THAT(e.what(), Catch::Contains("3 weights") && Catch::Contains("expected 4"));
  }
  std::vector<float> w4(4), s(3);
  REQUIRE_THROWS_AS(apply_sparse(adagrad{}, grads.view(),
                                 [&](std::size_t) {
                                   return row_ref{w4, s};
                                 }),
                    error);
}

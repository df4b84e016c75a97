#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/data/metrics.hpp"

using namespace strata;
using namespace strata::data;

namespace {

/// O(n²) Mann–Whitney: pairs (positive, negative) with positive scoring higher, ties 1/2.
double naive_auc(const std::vector<double>& scores, const std::vector<float>& labels) {
  double wins = 0, pairs = 0;
  for (std::size_t i = 0; i < scores.size(); ++i)
    for (std::size_t j = 0; j < scores.size(); ++j)
      if (labels[i] == 1 && labels[j] == 0) {
        pairs += 1;
        wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
      }
  return wins / pairs;
}

}  // namespace

TEST_CASE("auc equals the naive pair count, with and without ties", "[data][metrics]") {
  for (std::uint64_t trial = 0; trial < 20; ++trial) {
    const counter_rng rng{trial, 1};
    const std::size_t n = 2 + rng.below(0, 400);
    const std::uint64_t levels = trial % 2 == 0 ? 5 : 1'000'000;  // heavy ties / almost none
    std::vector<double> scores(n);
    std::vector<float> labels(n);
    for (std::size_t i = 0; i < n; ++i) {
      scores[i] = static_cast<double>(rng.below(10 + i, levels)) / static_cast<double>(levels);
      labels[i] = rng.uniform(100000 + i) < 0.3f ? 1.0f : 0.0f;
    }
    labels[0] = 1;
    labels[1] = 0;
    CAPTURE(trial, n);
    const double expected = naive_auc(scores, labels);
    REQUIRE(auc(scores, labels) == Approx(expected).epsilon(1e-12));
    std::vector<float> fscores(scores.begin(), scores.end());
    REQUIRE(auc(fscores, labels) == Approx(expected).epsilon(1e-12));
    REQUIRE(auc(std::span<const float>(fscores), labels) == Approx(expected).epsilon(1e-12));
  }
}

TEST_CASE("auc of hand-made cases", "[data][metrics]") {
  const std::vector<float> labels = {0, 0, 1, 1};
  REQUIRE(auc(std::vector<float>{0.1f, 0.2f, 0.3f, 0.4f}, labels) == 1.0);
  REQUIRE(auc(std::vector<float>{0.4f, 0.3f, 0.2f, 0.1f}, labels) == 0.0);
  REQUIRE(auc(std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f}, labels) == 0.5);
  // positives 0.35 and 0.8 vs negatives 0.1 and 0.4: pairs won 1 + 0 + 1 + 1 = 3 of 4.
  REQUIRE(auc(std::vector<float>{0.1f, 0.4f, 0.35f, 0.8f}, labels) == 0.75);
}

TEST_CASE("auc rejects undefined or malformed input", "[data][metrics]") {
  const std::vector<float> one_class = {1, 1, 1};
  REQUIRE_THROWS_WITH(auc(std::vector<float>{0.1f, 0.2f, 0.3f}, one_class),
                      Catch::Contains("both classes"));
  REQUIRE_THROWS_AS(auc(std::vector<float>{0.1f}, std::vector<float>{1, 0}), error);
  REQUIRE_THROWS_WITH(auc(std::vector<float>{0.1f, 0.2f}, std::vector<float>{1, 2}),
                      Catch::Contains("label[1] = 2"));
  REQUIRE_THROWS_WITH(auc(std::vector<float>{std::numeric_limits<float>::quiet_NaN(), 0.2f},
                          std::vector<float>{1, 0}),
                      Catch::Contains("NaN"));
  try {
    (void)logloss(std::vector<float>{0.5f}, std::vector<float>{1, 0});
    FAIL("no exception");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::size_mismatch);
  }
}

TEST_CASE("logloss, logloss from logits and accuracy against direct formulas", "[data][metrics]") {
  const counter_rng rng{5, 0};
  std::vector<double> z(300);
  std::vector<float> p(300), labels(300);
  double expected = 0;
  std::size_t right = 0;
  for (std::size_t i = 0; i < z.size(); ++i) {
    z[i] = 6.0 * (rng.uniform_double(i) - 0.5);
    const double prob = 1.0 / (1.0 + std::exp(-z[i]));
    p[i] = static_cast<float>(prob);
    labels[i] = rng.uniform(1000 + i) < 0.4f ? 1.0f : 0.0f;
    expected -= labels[i] == 1 ? std::log(prob) : std::log(1 - prob);
    right += (prob >= 0.5) == (labels[i] == 1) ? 1 : 0;
  }
  expected /= static_cast<double>(z.size());
  REQUIRE(logloss(p, labels) == Approx(expected).epsilon(1e-6));
  REQUIRE(logloss_from_logits(z, labels) == Approx(expected).epsilon(1e-12));
  REQUIRE(accuracy(p, labels) == Approx(static_cast<double>(right) / 300.0));
  REQUIRE(accuracy(z, labels, 0.0) == Approx(static_cast<double>(right) / 300.0));
  // Clipping keeps a confident mistake finite; large logits stay finite too.
  REQUIRE(std::isfinite(logloss(std::vector<float>{0.0f}, std::vector<float>{1})));
  REQUIRE(logloss_from_logits(std::vector<double>{-1000.0}, std::vector<float>{1}) ==
          Approx(1000.0));
  REQUIRE(logloss_from_logits(std::vector<double>{1000.0}, std::vector<float>{1}) == 0.0);
}

TEST_CASE("argmax accuracy", "[data][metrics]") {
  const std::vector<float> logits = {0.1f, 0.9f, 0.0f,   //
                                     2.0f, 1.0f, 3.0f,   //
                                     5.0f, 5.0f, 1.0f};  // tie → first
  const matrix_view<const float> view(logits.data(), 3, 3);
  REQUIRE(argmax_accuracy(view, std::vector<std::uint8_t>{1, 2, 0}) == 1.0);
  REQUIRE(argmax_accuracy(view, std::vector<int>{1, 0, 1}) == Approx(1.0 / 3.0));
  REQUIRE_THROWS_WITH(argmax_accuracy(view, std::vector<int>{1, 0, 3}),
                      Catch::Contains("label[2] = 3"));
  REQUIRE_THROWS_AS(argmax_accuracy(view, std::vector<int>{1, 0}), error);
}

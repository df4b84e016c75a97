#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "strata/compress.hpp"
#include "strata/core/rng.hpp"

using namespace strata;
using namespace strata::compress;

namespace {
/// A gradient with a small persistent per-position mean plus noise (what SGD sees).
std::vector<float> gradient(std::size_t n, std::uint64_t step) {
  const counter_rng noise{42, step}, bias{43, 0};
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i)
    g[i] = 0.05f * (bias.uniform(i) - 0.5f) + noise.normal(i);
  return g;
}

/// Feeds T steps through `codec`; returns max |Σ inputs − Σ decoded| after each step.
template <class C>
std::vector<double> drift(C& codec, std::size_t n, int steps,
                          std::vector<double>* gap_minus_residual = nullptr) {
  std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0);
  std::vector<std::byte> bytes(codec.max_encoded_bytes(n));
  std::vector<float> decoded(n);
  std::vector<double> worst;
  for (int t = 0; t < steps; ++t) {
    const auto g = gradient(n, static_cast<std::uint64_t>(t));
    const std::size_t size = codec.encode(g, bytes);
    codec.decode(std::span(bytes).first(size), decoded);
    double w = 0, mismatch = 0;
    for (std::size_t i = 0; i < n; ++i) {
      sum_in[i] += g[i];
      sum_out[i] += decoded[i];
      w = std::max(w, std::fabs(sum_in[i] - sum_out[i]));
      if constexpr (positional_compressor<C>)
        mismatch = std::max(mismatch, std::fabs(sum_in[i] - sum_out[i] - codec.residual()[i]));
    }
    worst.push_back(w);
    if (gap_minus_residual) gap_minus_residual->push_back(mismatch);
  }
  return worst;
}
}  // namespace

TEST_CASE("error feedback over int8 stays within one step's quantisation error",
          "[compress][error_feedback]") {
  const std::size_t n = 3000;
  error_feedback<int8_block<256>> codec(n);
  std::vector<double> identity_gap;
  const auto with_ef = drift(codec, n, 200, &identity_gap);
  // Σ inputs − Σ decoded is exactly the residual (up to float rounding of the sums) ...
  for (double m : identity_gap)
    REQUIRE(m < 1e-4);
  // ... and the residual is one quantisation error: ≤ absmax/254 of a block of
  // (gradient + residual), and gradients here stay below ~6 in magnitude.
  for (float r : codec.residual())
    REQUIRE(std::fabs(r) <= 6.5f / 254.0f);
  CHECK(*std::max_element(with_ef.begin() + 100, with_ef.end()) <= 6.5 / 254.0 + 1e-4);

  int8_block<256> plain;
  const auto without = drift(plain, n, 200);
  CHECK(without.back() > 2.0 * with_ef.back());  // plain rounding errors random-walk
}

TEST_CASE("error feedback makes topk unbiased; without it the drift grows with T",
          "[compress][error_feedback]") {
  const std::size_t n = 2000;
  error_feedback<topk> codec(n, topk(0.05));
  std::vector<double> identity_gap;
  const auto with_ef = drift(codec, n, 200, &identity_gap);
  for (double m : identity_gap)
    REQUIRE(m < 1e-3);
  // Bounded: the second half's worst gap is not larger than the first half's by much.
  const double first = *std::max_element(with_ef.begin(), with_ef.begin() + 100);
  const double second = *std::max_element(with_ef.begin() + 100, with_ef.end());
  CHECK(second < 1.3 * first);

  topk plain(0.05);
  const auto without = drift(plain, n, 200);
  CHECK(without[199] > 1.5 * without[49]);  // grows with T (≈ linearly from the bias)
  CHECK(without[199] > 3.0 * with_ef[199]);
}

TEST_CASE("encode_at updates only the residual of its positions", "[compress][error_feedback]") {
  error_feedback<int8_block<4>> codec(12);
  const std::vector<float> x = {1.0f, 0.3f, -0.7f, 0.01f, 0.5f};
  std::vector<std::byte> bytes(codec.max_encoded_bytes(x.size()));
  const std::size_t size = codec.encode_at(5, x, bytes);
  std::vector<float> decoded(x.size());
  codec.decode(std::span(bytes).first(size), decoded);
  for (std::size_t i = 0; i < 12; ++i) {
    if (i < 5 || i >= 10)
      REQUIRE(codec.residual()[i] == 0.0f);
    else
      REQUIRE(codec.residual()[i] == Approx(x[i - 5] - decoded[i - 5]).margin(1e-7));
  }
  REQUIRE(codec.residual()[6] != 0.0f);
  // The next encode of those positions carries the residual.
  const std::vector<float> zeros(x.size(), 0.0f);
  codec.encode_at(5, zeros, bytes);
  codec.decode(std::span(bytes).first(size), decoded);
  CHECK(decoded[1] != 0.0f);
  CHECK_THROWS_AS(codec.encode_at(8, x, bytes), error);  // [8, 13) is outside 12 positions
  codec.reset();
  for (float r : codec.residual())
    REQUIRE(r == 0.0f);
}

TEST_CASE("a non-finite step does not poison the residual", "[compress][error_feedback]") {
  error_feedback<int8_block<4>> codec(8);
  std::vector<float> x = {1, 2, std::numeric_limits<float>::infinity(), 4, 5, 6, 7, 8};
  std::vector<std::byte> bytes(codec.max_encoded_bytes(x.size()));
  codec.encode(x, bytes);
  for (float r : codec.residual())
    REQUIRE(std::isfinite(r));
  for (std::size_t i = 0; i < 4; ++i)
    REQUIRE(codec.residual()[i] == 0.0f);  // the poisoned block's residual is reset
}

TEST_CASE("keyed error feedback keeps a residual per key: per key, inputs − decoded = residual",
          "[compress][error_feedback]") {
  const std::size_t dim = 5;
  keyed_error_feedback<int8_block<64>> codec(dim);
  std::vector<std::byte> bytes(codec.max_encoded_bytes(10 * dim));
  std::vector<float> decoded;
  std::map<std::uint64_t, std::vector<double>> sum_in, sum_out;
  for (int step = 0; step < 30; ++step) {
    // A different subset of 40 keys every step (what a sparse push sends).
    const counter_rng pick{9, static_cast<std::uint64_t>(step)};
    std::vector<std::uint64_t> keys;
    for (std::uint64_t k = 0; k < 40 && keys.size() < 10; ++k)
      if (pick.uniform(k) < 0.3f) keys.push_back(k * 1000003);
    const auto g = gradient(keys.size() * dim, static_cast<std::uint64_t>(step));
    const std::size_t size = codec.encode_rows(keys, g, bytes);
    decoded.resize(g.size());
    codec.decode(std::span(bytes).first(size), decoded);
    for (std::size_t j = 0; j < keys.size(); ++j) {
      auto& in = sum_in[keys[j]];
      auto& out = sum_out[keys[j]];
      in.resize(dim, 0.0);
      out.resize(dim, 0.0);
      for (std::size_t c = 0; c < dim; ++c) {
        in[c] += g[j * dim + c];
        out[c] += decoded[j * dim + c];
      }
    }
  }
  REQUIRE(codec.size() == sum_in.size());
  double worst = 0;
  for (const auto& [key, in] : sum_in) {
    const auto r = codec.residual(key);
    for (std::size_t c = 0; c < dim; ++c) {
      CHECK(std::fabs(in[c] - sum_out[key][c] - r[c]) < 1e-4);
      worst = std::max(worst, std::fabs(double(r[c])));
    }
  }
  CHECK(worst < 0.1);  // one step's int8 error of values of magnitude ~3, not 30 steps' worth
  CHECK(worst > 0.0);
  CHECK(codec.residual(7) == std::vector<float>(dim, 0.0f));  // never encoded

  // Residuals move to another object: both then encode the same bytes.
  keyed_error_feedback<int8_block<64>> copy(dim);
  codec.for_each_residual(
      [&](std::uint64_t key, std::span<const float> r) { copy.restore(key, r); });
  const std::vector<std::uint64_t> keys{0, 1000003 * 3, 5};
  const auto g = gradient(keys.size() * dim, 99);
  std::vector<std::byte> a(codec.max_encoded_bytes(g.size())), b(a.size());
  const std::size_t na = codec.encode_rows(keys, g, a), nb = copy.encode_rows(keys, g, b);
  REQUIRE(na == nb);
  CHECK(std::equal(a.begin(), a.begin() + static_cast<std::ptrdiff_t>(na), b.begin()));
  CHECK(codec.residual(5) == copy.residual(5));

  CHECK_THROWS_WITH(codec.encode_rows(keys, std::span(g).first(4), a),
                    Catch::Contains("4 values for 3 keys of 5"));
  CHECK_THROWS_WITH(copy.restore(1, std::vector<float>(2)), Catch::Contains("2 values"));
  CHECK_THROWS_AS(keyed_error_feedback<int8_block<64>>(0), strata::error);
  copy.clear();
  CHECK(copy.size() == 0);
  CHECK(copy.residual(5) == std::vector<float>(dim, 0.0f));
}

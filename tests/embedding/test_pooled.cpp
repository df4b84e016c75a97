#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/embedding.hpp"
#include "strata/optim.hpp"
#include "support/catch_error.hpp"

using strata_test::catch_error;

using namespace strata;
using namespace strata::embedding;

namespace {
struct bags {
  std::vector<std::uint64_t> keys;
  std::vector<std::uint64_t> offsets{0};
};

/// Bags of length 0..max_len (an empty bag included) over keys below `rows`.
bags make_bags(std::size_t count, std::size_t max_len, std::uint64_t rows, std::uint64_t seed) {
  bags b;
  const counter_rng rng{seed, 0};
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t len = i == 1 ? 0 : 1 + rng.below(2 * i, max_len);
    for (std::size_t j = 0; j < len; ++j)
      b.keys.push_back(rng.below(2 * i + 1 + (j << 32), rows));
    b.offsets.push_back(b.keys.size());
  }
  return b;
}

/// Naive pooled forward in double.
template <class S>
std::vector<double> naive_forward(const S& s, std::size_t t, const bags& b, pooling mode) {
  const std::size_t dim = s.spec(t).dim;
  std::vector<double> out((b.offsets.size() - 1) * dim, 0.0);
  for (std::size_t bag = 0; bag + 1 < b.offsets.size(); ++bag) {
    const std::size_t len = b.offsets[bag + 1] - b.offsets[bag];
    for (std::size_t i = b.offsets[bag]; i < b.offsets[bag + 1]; ++i)
      for (std::size_t c = 0; c < dim; ++c)
        out[bag * dim + c] += s.row(t, b.keys[i])[c] / (mode == pooling::mean ? double(len) : 1.0);
  }
  return out;
}

template <class S>
void check_forward(S& s, std::size_t t, const bags& b, pooling mode) {
  const std::size_t dim = s.spec(t).dim;
  matrix<float> out(b.offsets.size() - 1, dim);
  pooled_lookup lookup;
  lookup.forward(s, t, b.keys, b.offsets, mode, out);
  const auto expected = naive_forward(std::as_const(s), t, b, mode);
  for (std::size_t i = 0; i < out.size(); ++i)
    REQUIRE(out.flat()[i] == Approx(expected[i]).epsilon(1e-5).margin(1e-6));
}

}  // namespace

TEST_CASE("pooled forward equals a naive sum/mean, for local and hash_table",
          "[embedding][pooled]") {
  local<optim::sgd> dense({{"x", 3, 2}, {"y", 500, 16}}, {}, {.seed = 4});
  hash_table<optim::sgd> hashed({{"x", 3, 2}, {"y", 500, 16}}, {}, {.seed = 4});
  for (pooling mode : {pooling::sum, pooling::mean}) {
    for (std::size_t count : {1u, 7u, 3000u}) {  // 3000 bags: parallel path
      INFO("bags " << count << " mode " << static_cast<int>(mode));
      const bags b = make_bags(count, 20, 500, count);
      check_forward(dense, 1, b, mode);
      pooled_lookup lookup;  // hash_table goes through gather + pool: compare with local
      matrix<float> from_dense(count, 16), from_hash(count, 16);
      lookup.forward(dense, 1, b.keys, b.offsets, mode, from_dense);
      lookup.forward(hashed, 1, b.keys, b.offsets, mode, from_hash);
      for (std::size_t i = 0; i < from_dense.size(); ++i)
        REQUIRE(from_hash.flat()[i] == Approx(from_dense.flat()[i]).epsilon(1e-6).margin(1e-7));
    }
  }
  // Empty bag pools to zeros in both modes.
  const bags b = make_bags(3, 4, 3, 1);
  matrix<float> out(3, 2);
  pooled_lookup lookup;
  lookup.forward(dense, 0, b.keys, b.offsets, pooling::mean, out);
  REQUIRE(out(1, 0) == 0.0f);
  REQUIRE(out(1, 1) == 0.0f);
}

TEST_CASE("pooled backward equals finite differences of the pooled loss", "[embedding][pooled]") {
  // Loss L(W) = Σ_b <R_b, pooled_b(W)>, linear in W, so central differences are exact up to
  // rounding. SGD with lr = 1 makes the applied gradient readable as W_before − W_after.
  const std::size_t rows = 40, dim = 3;
  const bags b = make_bags(25, 6, rows, 12);
  const std::size_t count = b.offsets.size() - 1;
  matrix<float> r(count, dim);
  for (std::size_t i = 0; i < r.size(); ++i)
    r.flat()[i] = counter_rng{5, 5}.normal(i);
  for (pooling mode : {pooling::sum, pooling::mean}) {
    local<optim::sgd> tables({{"t", rows, dim}}, {.lr = 1.0f}, {.seed = 2});
    pooled_lookup lookup;
    const auto loss = [&] {
      matrix<float> out(count, dim);
      lookup.forward(tables, 0, b.keys, b.offsets, mode, out);
      double sum = 0;
      for (std::size_t i = 0; i < out.size(); ++i)
        sum += double(out.flat()[i]) * r.flat()[i];
      return sum;
    };
    std::vector<double> numeric(rows * dim);
    const float h = 0.125f;
    for (std::uint64_t k = 0; k < rows; ++k)
      for (std::size_t c = 0; c < dim; ++c) {
        float& w = tables.row(0, k)[c];
        const float w0 = w;
        w = w0 + h;
        const double up = loss();
        w = w0 - h;
        const double down = loss();
        w = w0;
        numeric[k * dim + c] = (up - down) / (2.0 * h);
      }
    local<optim::sgd> before({{"t", rows, dim}}, {.lr = 1.0f}, {.seed = 2});
    lookup.backward(tables, 0, b.keys, b.offsets, mode, r.view());
    REQUIRE(lookup.key_grads().rows() == 0);  // local: fused, no per-key rows
    for (std::uint64_t k = 0; k < rows; ++k)
      for (std::size_t c = 0; c < dim; ++c) {
        INFO("mode " << static_cast<int>(mode) << " key " << k << " col " << c);
        const double applied = double(before.row(0, k)[c]) - tables.row(0, k)[c];
        REQUIRE(applied == Approx(numeric[k * dim + c]).epsilon(1e-4).margin(1e-5));
      }
  }
}

namespace {
/// A storage without `apply_pooled_gradients`: pooled backward takes the unpool path.
struct unfused {
  local<optim::adagrad>& inner;
  [[nodiscard]] std::size_t table_count() const { return inner.table_count(); }
  [[nodiscard]] const table_spec& spec(std::size_t t) const { return inner.spec(t); }
  void gather(std::size_t t, std::span<const std::uint64_t> keys, matrix_view<float> out) {
    inner.gather(t, keys, out);
  }
  void apply_gradients(std::size_t t, std::span<const std::uint64_t> keys,
                       matrix_view<const float> grads) {
    inner.apply_gradients(t, keys, grads);
  }
};
}  // namespace

TEST_CASE("pooled backward: the unpool path (key_grads) and the fused path agree bitwise",
          "[embedding][pooled]") {
  STATIC_REQUIRE(storage<unfused>);
  for (pooling mode : {pooling::sum, pooling::mean}) {
    local<optim::adagrad> a({{"t", 300, 16}}, {.lr = 0.1f}, {.seed = 3});
    local<optim::adagrad> b({{"t", 300, 16}}, {.lr = 0.1f}, {.seed = 3});
    unfused via_unpool{b};
    pooled_lookup fused, plain;
    for (std::uint64_t step = 0; step < 3; ++step) {
      const bags batch = make_bags(400, 12, 300, 10 + step);
      matrix<float> d_out(400, 16);
      for (std::size_t i = 0; i < d_out.size(); ++i)
        d_out.flat()[i] = counter_rng{step, 9}.normal(i);
      fused.backward(a, 0, batch.keys, batch.offsets, mode, d_out.view());
      plain.backward(via_unpool, 0, batch.keys, batch.offsets, mode, d_out.view());
      REQUIRE(fused.key_grads().rows() == 0);
      REQUIRE(plain.key_grads().rows() == batch.keys.size());
      REQUIRE(plain.key_grads().cols() == 16);
      const auto wa = a.weights(0), wb = b.weights(0);
      REQUIRE(std::memcmp(wa.data(), wb.data(), 300 * 16 * sizeof(float)) == 0);
      for (std::uint64_t k = 0; k < 300; ++k)
        REQUIRE(std::memcmp(a.state(0, k).data(), b.state(0, k).data(), 16 * sizeof(float)) == 0);
    }
  }
}

TEST_CASE("unpool scales by 1/length for mean", "[embedding][pooled]") {
  const std::vector<std::uint64_t> offsets{0, 2, 2, 3};
  matrix<float> d_out(3, 1), key_grads(3, 1);
  d_out(0, 0) = 4.0f;
  d_out(1, 0) = 100.0f;  // empty bag: nothing to write
  d_out(2, 0) = 6.0f;
  unpool(d_out.view(), offsets, pooling::mean, key_grads);
  REQUIRE(key_grads(0, 0) == 2.0f);
  REQUIRE(key_grads(1, 0) == 2.0f);
  REQUIRE(key_grads(2, 0) == 6.0f);
  unpool(d_out.view(), offsets, pooling::sum, key_grads);
  REQUIRE(key_grads(0, 0) == 4.0f);
}

TEST_CASE("pooled rejects bad offsets, shapes and keys", "[embedding][pooled][errors]") {
  local<optim::sgd> tables({{"t", 10, 2}});
  pooled_lookup lookup;
  const std::vector<std::uint64_t> keys{1, 2, 3};
  matrix<float> out(2, 2);
  const auto bad = [&](std::vector<std::uint64_t> offsets, const char* text) {
    auto e = catch_error([&] { lookup.forward(tables, 0, keys, offsets, pooling::sum, out); });
    REQUIRE(e.code() == errc::invalid_argument);
    REQUIRE_THAT(e.what(), Catch::Contains(text));
  };
  bad({}, "offsets is empty");
  bad({1, 2, 3}, "offsets[0] is 1");
  bad({0, 2, 1}, "decrease at bag 1");
  bad({0, 1, 2}, "last offset is 2 but there are 3 keys");
  bad({0, 1, 4}, "last offset is 4");

  const std::vector<std::uint64_t> offsets{0, 1, 3};
  matrix<float> wrong(3, 2);
  auto e = catch_error([&] { lookup.forward(tables, 0, keys, offsets, pooling::sum, wrong); });
  REQUIRE(e.code() == errc::size_mismatch);
  const std::vector<std::uint64_t> far{1, 2, 10};
  e = catch_error([&] { lookup.forward(tables, 0, far, offsets, pooling::sum, out); });
  REQUIRE(e.code() == errc::out_of_range);
  REQUIRE_THAT(e.what(), Catch::Contains("key 10") && Catch::Contains("[0, 10)"));
  matrix<float> d_out(3, 2);
  e = catch_error([&] { lookup.backward(tables, 0, keys, offsets, pooling::sum, d_out.view()); });
  REQUIRE(e.code() == errc::size_mismatch);
  matrix<float> three_cols(2, 3);
  e = catch_error([&] { pool(wrong.view(), offsets, pooling::sum, three_cols); });
  REQUIRE(e.code() == errc::size_mismatch);
  e = catch_error([&] { unpool(out.view(), offsets, pooling::sum, three_cols); });
  REQUIRE(e.code() == errc::invalid_argument);  // 2 key rows for offsets ending at 3
}

// The fused sparse update (key_groups + apply_grouped: local::apply_gradients,
// local::apply_pooled_gradients, pooled_lookup::backward) against a plain reference: per-key
// gradient rows (the old `unpool`), summed per key in input order with a std::map (first row
// copied, the others added one by one), then the optimizer applied once per key. Every
// optimizer, 1 and 2 threads, serial and parallel (key-share) paths; compared bitwise.
#include <catch2/catch.hpp>

#include <oneapi/tbb/task_arena.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/embedding.hpp"
#include "strata/optim.hpp"
#include "support/catch_error.hpp"
#include "support/skip.hpp"

using strata_test::catch_error;

using namespace strata;
using namespace strata::embedding;

namespace {

struct bags {
  std::vector<std::uint64_t> keys;
  std::vector<std::uint64_t> offsets{0};
};

/// `count` bags of 0..max_len keys drawn from [0, key_range) with a skew towards small keys
/// (many duplicates, also within one bag).
bags make_bags(std::size_t count, std::size_t max_len, std::uint64_t key_range,
               std::uint64_t seed) {
  bags b;
  const counter_rng rng{seed, 0};
  std::uint64_t draw = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t len = rng.below(draw++, max_len + 1);
    for (std::size_t j = 0; j < len; ++j) {
      const std::uint64_t r = rng.below(draw++, key_range);
      b.keys.push_back(rng.below(draw++, 4) == 0 ? r : r % (1 + key_range / 16));
    }
    b.offsets.push_back(b.keys.size());
  }
  return b;
}

matrix<float> random_rows(std::size_t rows, std::size_t dim, std::uint64_t seed) {
  matrix<float> m(rows, dim);
  for (std::size_t i = 0; i < m.size(); ++i)
    m.flat()[i] = counter_rng{seed, 7}.normal(i);
  return m;
}

/// Dense copy of a table: weights then state, key by key.
struct snapshot {
  std::vector<float> weights, state;
};

template <class O>
snapshot snap(const local<O>& s, std::size_t t) {
  snapshot out;
  s.for_each_row(t, [&](std::uint64_t, std::span<const float> w, std::span<const float> st) {
    out.weights.insert(out.weights.end(), w.begin(), w.end());
    out.state.insert(out.state.end(), st.begin(), st.end());
  });
  return out;
}

/// n floats at a and b have the same bits (n = 0 is true; memcmp may not see null pointers).
bool same_floats(const float* a, const float* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n * sizeof(float)) == 0;
}

bool same_bits(const snapshot& a, const snapshot& b) {
  // Bit patterns, not float ==: NaN rows must match too. memcmp of zero bytes may see null
  // pointers (SGD keeps no state), so empty buffers are compared by size alone.
  const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && same_floats(x.data(), y.data(), x.size());
  };
  return same(a.weights, b.weights) && same(a.state, b.state);
}

/// The reference update: key_grads.row(i) is the gradient of keys[i]'s row.
template <class O>
void reference_update(const O& opt, snapshot& table, std::size_t dim,
                      const std::vector<std::uint64_t>& keys, matrix_view<const float> key_grads) {
  std::map<std::uint64_t, std::vector<float>> sums;
  for (std::size_t i = 0; i < keys.size(); ++i) {
    const auto row = key_grads.row(i);
    auto [it, fresh] = sums.try_emplace(keys[i], row.begin(), row.end());
    if (!fresh)
      for (std::size_t c = 0; c < dim; ++c)
        it->second[c] += row[c];
  }
  const std::size_t sf = O::state_floats(dim);
  for (const auto& [key, grad] : sums)
    opt.apply({table.weights.data() + key * dim, dim}, {table.state.data() + key * sf, sf}, grad);
}

/// Per-key rows of a pooled backward, as the old path built them.
matrix<float> unpooled(const bags& b, const matrix<float>& d_out, pooling mode) {
  matrix<float> rows(b.keys.size(), d_out.cols());
  unpool(d_out.view(), b.offsets, mode, rows);
  return rows;
}

template <class O>
O make_optimizer() {
  if constexpr (std::is_same_v<O, optim::sgd>) return {.lr = 0.05f};
  if constexpr (std::is_same_v<O, optim::adagrad>)
    return {.lr = 0.05f, .initial_accumulator = 0.1f};
  if constexpr (std::is_same_v<O, optim::adam>) return {.lr = 0.01f};
  if constexpr (std::is_same_v<O, optim::ftrl>) return {.alpha = 0.1f, .l1 = 0.01f, .l2 = 0.1f};
}

struct shape {
  std::size_t dim, bags, max_len;
  std::uint64_t rows;
};

// Small (serial) and large (≥ 256 K floats of work: key shares in parallel with 2 threads);
// dims with a fixed-width kernel (8, 16, 64) and without (3).
const shape shapes[] = {{8, 40, 5, 9}, {3, 300, 6, 60}, {16, 3000, 20, 800}, {64, 1200, 12, 5000}};

/// 1 and 2 threads. Sanitizer builds (-O0, ASan: 67 s for both) run 2 only: the small shapes
/// still take the serial path there and the large ones the parallel one.
std::vector<int> thread_counts() {
  return strata_test::sanitized() ? std::vector<int>{2} : std::vector<int>{1, 2};
}

}  // namespace

TEMPLATE_TEST_CASE(
    "pooled backward (fused; local and hash_table) equals unpool + map-summed "
    "reference, bitwise",
    "[embedding][local][hash_table][pooled][sparse_update]", optim::sgd, optim::adagrad,
    optim::adam, optim::ftrl) {
  const TestType opt = make_optimizer<TestType>();
  for (const shape& sh : shapes) {
    for (int threads : thread_counts()) {
      for (pooling mode : {pooling::sum, pooling::mean}) {
        INFO("dim " << sh.dim << " bags " << sh.bags << " threads " << threads << " mode "
                    << static_cast<int>(mode));
        local<TestType> tables({{"t", sh.rows, sh.dim}}, opt, {.seed = 9});
        hash_table<TestType> hashed({{"t", 0, sh.dim}}, opt, {.seed = 9});
        snapshot want = snap(tables, 0);
        const std::size_t sf = TestType::state_floats(sh.dim);
        std::set<std::uint64_t> touched;
        pooled_lookup lookup;
        tbb::task_arena arena(threads);
        for (std::uint64_t step = 0; step < 3; ++step) {  // state carries over between steps
          const bags b = make_bags(sh.bags, sh.max_len, sh.rows, 100 * step + sh.dim);
          const matrix<float> d_out = random_rows(sh.bags, sh.dim, step + 1);
          arena.execute([&] {
            lookup.backward(tables, 0, b.keys, b.offsets, mode, d_out.view());
            lookup.backward(hashed, 0, b.keys, b.offsets, mode, d_out.view());
          });
          REQUIRE(lookup.key_grads().rows() == 0);  // both fused: no per-key rows
          reference_update(opt, want, sh.dim, b.keys, unpooled(b, d_out, mode).view());
          REQUIRE(same_bits(snap(tables, 0), want));
          touched.insert(b.keys.begin(), b.keys.end());
        }
        REQUIRE(hashed.size(0) == touched.size());
        for (const std::uint64_t k : touched) {
          const auto w = std::as_const(hashed).row(0, k);
          const auto st = std::as_const(hashed).state(0, k);
          REQUIRE(same_floats(w.data(), want.weights.data() + k * sh.dim, sh.dim));
          REQUIRE(same_floats(st.data(), want.state.data() + k * sf, sf));
        }
      }
    }
  }
}

TEMPLATE_TEST_CASE("local::apply_gradients equals the map-summed reference, bitwise",
                   "[embedding][local][sparse_update]", optim::sgd, optim::adagrad, optim::adam,
                   optim::ftrl) {
  const TestType opt = make_optimizer<TestType>();
  for (const shape& sh : shapes) {
    for (int threads : thread_counts()) {
      INFO("dim " << sh.dim << " bags " << sh.bags << " threads " << threads);
      local<TestType> tables({{"t", sh.rows, sh.dim}}, opt, {.seed = 5});
      snapshot want = snap(tables, 0);
      tbb::task_arena arena(threads);
      for (std::uint64_t step = 0; step < 3; ++step) {
        const bags b = make_bags(sh.bags, sh.max_len, sh.rows, 7 * step + sh.dim);
        const matrix<float> grads = random_rows(b.keys.size(), sh.dim, step + 11);
        arena.execute([&] { tables.apply_gradients(0, b.keys, grads.view()); });
        reference_update(opt, want, sh.dim, b.keys, grads.view());
        REQUIRE(same_bits(snap(tables, 0), want));
      }
    }
  }
}

TEMPLATE_TEST_CASE("sum_duplicates + apply_sparse and hash_table equal the reference, bitwise",
                   "[embedding][hash_table][sparse_update]", optim::sgd, optim::adagrad,
                   optim::adam, optim::ftrl) {
  const TestType opt = make_optimizer<TestType>();
  for (const shape& sh : shapes) {
    for (int threads : thread_counts()) {
      INFO("dim " << sh.dim << " bags " << sh.bags << " threads " << threads);
      local<TestType> tables({{"t", sh.rows, sh.dim}}, opt, {.seed = 5});
      hash_table<TestType> hashed({{"t", sh.rows, sh.dim}}, opt, {.seed = 5});
      snapshot want = snap(tables, 0);
      snapshot raw = want;  // updated by sum_duplicates + apply_sparse
      const std::size_t sf = TestType::state_floats(sh.dim);
      optim::sparse_gradient work;
      std::set<std::uint64_t> touched;
      tbb::task_arena arena(threads);
      for (std::uint64_t step = 0; step < 3; ++step) {
        const bags b = make_bags(sh.bags, sh.max_len, sh.rows, 3 * step + sh.dim);
        const matrix<float> grads = random_rows(b.keys.size(), sh.dim, step + 21);
        arena.execute([&] {
          hashed.apply_gradients(0, b.keys, grads.view());
          work.sum_duplicates(b.keys, grads.view());
          const auto unique = work.keys();
          REQUIRE(std::is_sorted(unique.begin(), unique.end()));
          optim::apply_sparse(opt, work.grads(), [&](std::size_t i) {
            return optim::row_ref{{raw.weights.data() + unique[i] * sh.dim, sh.dim},
                                  {raw.state.data() + unique[i] * sf, sf}};
          });
        });
        reference_update(opt, want, sh.dim, b.keys, grads.view());
        touched.insert(b.keys.begin(), b.keys.end());
        REQUIRE(same_bits(raw, want));
      }
      for (const std::uint64_t k : touched) {
        const auto w = std::as_const(hashed).row(0, k);
        const auto st = std::as_const(hashed).state(0, k);
        REQUIRE(same_floats(w.data(), want.weights.data() + k * sh.dim, sh.dim));
        REQUIRE(same_floats(st.data(), want.state.data() + k * sf, sf));
      }
    }
  }
}

TEST_CASE("fused updates handle empty input and reject bad input before changing anything",
          "[embedding][local][sparse_update][errors]") {
  local<optim::adam> tables({{"t", 1000, 16}}, {}, {.seed = 2});
  const snapshot before = snap(tables, 0);
  pooled_lookup lookup;
  matrix<float> none(0, 16), two(2, 16);
  lookup.backward(tables, 0, {}, std::vector<std::uint64_t>{0}, pooling::sum, none.view());
  lookup.backward(tables, 0, {}, std::vector<std::uint64_t>{0, 0, 0}, pooling::mean, two.view());
  tables.apply_gradients(0, {}, none.view());
  REQUIRE(same_bits(snap(tables, 0), before));

  for (int threads : {1, 2}) {
    tbb::task_arena arena(threads);
    bags b = make_bags(3000, 20, 1000, 4);  // large: the parallel path with 2 threads
    b.keys[b.keys.size() / 2] = 1000;
    const matrix<float> d_out = random_rows(3000, 16, 1);
    auto e = catch_error([&] {
      arena.execute(
          [&] { lookup.backward(tables, 0, b.keys, b.offsets, pooling::sum, d_out.view()); });
    });
    REQUIRE(e.code() == errc::out_of_range);
    REQUIRE_THAT(e.what(), Catch::Contains("key 1000") && Catch::Contains("[0, 1000)"));
    const matrix<float> grads = random_rows(b.keys.size(), 16, 2);
    e = catch_error(
        [&] { arena.execute([&] { tables.apply_gradients(0, b.keys, grads.view()); }); });
    REQUIRE(e.code() == errc::out_of_range);
    REQUIRE(same_bits(snap(tables, 0), before));
  }
  const std::vector<std::uint64_t> keys{1, 2, 3};
  matrix<float> d_out(2, 16), narrow(2, 8);
  auto e = catch_error([&] {
    tables.apply_pooled_gradients(0, keys, std::vector<std::uint64_t>{0, 1, 3}, pooling::sum,
                                  narrow.view());
  });
  REQUIRE(e.code() == errc::size_mismatch);
  REQUIRE_THAT(e.what(), Catch::Contains("d_out is 2 x 8") && Catch::Contains("2 x 16"));
  e = catch_error([&] {
    tables.apply_pooled_gradients(0, keys, std::vector<std::uint64_t>{0, 2, 1}, pooling::sum,
                                  d_out.view());
  });
  REQUIRE(e.code() == errc::invalid_argument);
  e = catch_error([&] {
    tables.apply_pooled_gradients(1, keys, std::vector<std::uint64_t>{0, 1, 3}, pooling::sum,
                                  d_out.view());
  });
  REQUIRE(e.code() == errc::out_of_range);
  REQUIRE(same_bits(snap(tables, 0), before));
}

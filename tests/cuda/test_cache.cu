// cuda::row_cache against its backing storage: outputs bitwise equal to the backing's gather,
// staleness bounds, invalidation on write, and errors. The backing is a small std::vector
// storage defined here, so nvcc never parses Eigen / oneTBB.
#include "cuda/test_support.cuh"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "strata/core/matrix.hpp"
#include "strata/core/rng.hpp"
#include "strata/cuda/row_cache.cuh"
#include "strata/embedding/concepts.hpp"
#include "support/catch_error.hpp"

using strata_test::catch_error;
using strata_test::contains;

namespace embedding = strata::embedding;
namespace cuda_test = strata::cuda_test;
namespace sc = strata::cuda;
using strata::errc;
using strata::matrix_view;
using strata::cuda_test::skip_without_gpu;

namespace {

constexpr std::uint64_t never_stale = std::numeric_limits<std::uint64_t>::max();

/// Fixed-vocabulary tables in std::vectors. Row k of table t starts at deterministic values;
/// apply_gradients is plain SGD with lr 0.5 applied key by key (duplicates in input order).
/// Counts the rows its gather copies, so a test sees the cache's traffic.
class vector_storage {
 public:
  explicit vector_storage(std::vector<embedding::table_spec> specs) : specs_(std::move(specs)) {
    for (std::size_t t = 0; t < specs_.size(); ++t) {
      std::vector<float> w(specs_[t].rows * specs_[t].dim);
      for (std::size_t i = 0; i < w.size(); ++i)
        w[i] = static_cast<float>(strata::mix_ids(t, i) >> 40) / 16777216.0f - 0.5f;
      weights_.push_back(std::move(w));
    }
  }

  [[nodiscard]] std::size_t table_count() const noexcept { return specs_.size(); }
  [[nodiscard]] const embedding::table_spec& spec(std::size_t t) const { return specs_.at(t); }

  void gather(std::size_t t, std::span<const std::uint64_t> keys, matrix_view<float> out) {
    check(t, keys, out.rows(), out.cols());
    const std::size_t dim = specs_[t].dim;
    for (std::size_t i = 0; i < keys.size(); ++i)
      std::copy_n(weights_[t].data() + keys[i] * dim, dim, out.row(i).data());
    rows_gathered += keys.size();
    ++gather_calls;
  }

  void apply_gradients(std::size_t t, std::span<const std::uint64_t> keys,
                       matrix_view<const float> grads) {
    check(t, keys, grads.rows(), grads.cols());
    const std::size_t dim = specs_[t].dim;
    for (std::size_t i = 0; i < keys.size(); ++i)
      for (std::size_t c = 0; c < dim; ++c)
        weights_[t][keys[i] * dim + c] -= 0.5f * grads(i, c);
  }

  /// Sets every value of row `key` of table t (a change behind the cache's back, as another
  /// worker's update on a parameter server).
  void set_row(std::size_t t, std::uint64_t key, float value) {
    const std::size_t dim = specs_[t].dim;
    std::fill_n(weights_[t].data() + key * dim, dim, value);
  }

  /// The rows of `keys` as the storage has them now (does not count as traffic).
  [[nodiscard]] std::vector<float> expected(std::size_t t,
                                            const std::vector<std::uint64_t>& keys) const {
    const std::size_t dim = specs_[t].dim;
    std::vector<float> out(keys.size() * dim);
    for (std::size_t i = 0; i < keys.size(); ++i)
      std::copy_n(weights_[t].data() + keys[i] * dim, dim, out.data() + i * dim);
    return out;
  }

  std::uint64_t rows_gathered = 0;
  std::uint64_t gather_calls = 0;

 private:
  void check(std::size_t t, std::span<const std::uint64_t> keys, std::size_t rows,
             std::size_t cols) const {
    if (t >= specs_.size()) strata::fail(errc::out_of_range, "vector_storage: no such table");
    if (rows != keys.size() || cols != specs_[t].dim)
      strata::fail(errc::size_mismatch, "vector_storage: wrong shape");
    for (const std::uint64_t k : keys)
      if (k >= specs_[t].rows)
        strata::fail(errc::out_of_range,
                     strata::cat("vector_storage: key ", k, " of table ", t, " '", specs_[t].name,
                                 "' is outside [0, ", specs_[t].rows, ")"));
  }

  std::vector<embedding::table_spec> specs_;
  std::vector<std::vector<float>> weights_;
};

static_assert(embedding::storage<vector_storage>);

/// A batch of `n` keys with at most `max_distinct` distinct ones: a hot set (keys below `hot`)
/// and cold keys over the whole table, with duplicates.
std::vector<std::uint64_t> random_batch(std::mt19937_64& gen, std::size_t n,
                                        std::size_t max_distinct, std::uint64_t rows,
                                        std::uint64_t hot) {
  std::uniform_int_distribution<std::uint64_t> hot_key(0, hot - 1), any_key(0, rows - 1);
  std::bernoulli_distribution is_hot(0.7);
  std::vector<std::uint64_t> pool;
  const std::size_t distinct = std::max<std::size_t>(1, std::min(n, max_distinct));
  std::set<std::uint64_t> seen;
  while (pool.size() < distinct) {
    const std::uint64_t k = is_hot(gen) ? hot_key(gen) : any_key(gen);
    if (seen.insert(k).second) pool.push_back(k);
  }
  std::uniform_int_distribution<std::size_t> pick(0, pool.size() - 1);
  std::vector<std::uint64_t> keys(n);
  for (auto& k : keys)
    k = pool[pick(gen)];
  return keys;
}

/// One gather into a fresh poisoned buffer, checked against the storage's rows now.
std::vector<float> cached_gather(sc::row_cache<vector_storage>& cache, std::size_t t,
                                 const std::vector<std::uint64_t>& keys, std::uint64_t step,
                                 cudaStream_t s) {
  auto out = cuda_test::poisoned(keys.size() * cache.spec(t).dim, s);
  cache.gather(t, keys, out.data(), step);
  return out.download();
}

}  // namespace

TEST_CASE(
    "row_cache: gathers are bitwise the backing's rows, caches smaller and larger than "
    "the working set",
    "[cuda][cache]") {
  if (skip_without_gpu()) return;
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  std::mt19937_64 gen(seed);
  sc::stream s;
  const std::vector<embedding::table_spec> specs{{"users", 1000, 16}, {"items", 300, 7}};
  for (const std::size_t capacity : {std::size_t{64}, std::size_t{2000}})
    for (const std::uint64_t staleness : {std::uint64_t{0}, std::uint64_t{2}, never_stale}) {
      CAPTURE(capacity, staleness);
      vector_storage storage(specs);
      sc::row_cache<vector_storage> cache(storage, capacity, staleness, s);
      struct pending {
        sc::device_buffer<float> out;
        std::vector<float> want;
      };
      std::vector<pending> queued;
      std::uint64_t fetched_by_cache = 0;
      std::vector<std::uint64_t> distinct_per_table(2, 0);
      for (std::uint64_t step = 0; step < 40; ++step) {
        const int gathers = 1 + static_cast<int>(step % 3);
        for (int g = 0; g < gathers; ++g) {
          const std::size_t t = (step + static_cast<std::uint64_t>(g)) % 2;
          std::uniform_int_distribution<std::size_t> len(1, 150);
          const auto keys = random_batch(gen, len(gen), capacity, specs[t].rows, 40);
          distinct_per_table[t] += std::set<std::uint64_t>(keys.begin(), keys.end()).size();
          pending p{cuda_test::poisoned(keys.size() * specs[t].dim, s), storage.expected(t, keys)};
          const std::uint64_t before = storage.rows_gathered;
          cache.gather(t, keys, p.out.data(), step);
          fetched_by_cache += storage.rows_gathered - before;
          queued.push_back(std::move(p));
        }
        if (step % 5 == 4) {  // several gathers in flight between checks (staging reuse)
          for (auto& p : queued)
            cuda_test::require_bits_equal(p.out.download(), p.want);
          queued.clear();
        }
      }
      for (auto& p : queued)
        cuda_test::require_bits_equal(p.out.download(), p.want);
      std::uint64_t misses = 0;
      for (std::size_t t = 0; t < 2; ++t) {
        const sc::row_cache_stats st = cache.stats(t);
        CHECK(st.hits + st.misses == distinct_per_table[t]);
        CHECK(st.bytes_saved == st.hits * specs[t].dim * sizeof(float));
        CHECK(st.bytes_host_to_device ==
              st.misses * specs[t].dim * sizeof(float) + (st.misses + st.lookups) * 4);
        if (capacity < specs[t].rows) CHECK(st.evictions > 0);
        if (capacity >= specs[t].rows) CHECK(st.evictions == 0);
        if (staleness == never_stale) CHECK(st.hits > 0);
        misses += st.misses;
      }
      CHECK(misses == fetched_by_cache);  // each miss is one row of backing traffic
    }
}

TEST_CASE("row_cache: a row changed in the backing shows after S + 1 steps, not before",
          "[cuda][cache]") {
  if (skip_without_gpu()) return;
  sc::stream s;
  const std::vector<std::uint64_t> keys{1, 2, 3, 2};
  for (const std::uint64_t staleness : {std::uint64_t{0}, std::uint64_t{3}}) {
    CAPTURE(staleness);
    vector_storage storage({{"t", 100, 8}});
    sc::row_cache<vector_storage> cache(storage, 16, staleness, s);
    const std::vector<float> old_rows = storage.expected(0, keys);
    cuda_test::require_bits_equal(cached_gather(cache, 0, keys, 10, s), old_rows);
    storage.set_row(0, 2, 42.0f);  // another worker's update, behind the cache's back
    for (std::uint64_t step = 10; step <= 10 + staleness; ++step) {
      CAPTURE(step);
      cuda_test::require_bits_equal(cached_gather(cache, 0, keys, step, s), old_rows);
    }
    const std::uint64_t before = storage.rows_gathered;
    cuda_test::require_bits_equal(cached_gather(cache, 0, keys, 11 + staleness, s),
                                  storage.expected(0, keys));
    CHECK(storage.rows_gathered - before == 3);  // 1, 2, 3 refetched, once each
  }
}

TEST_CASE("row_cache: apply_gradients forgets the written rows (invalidate_on_write)",
          "[cuda][cache]") {
  if (skip_without_gpu()) return;
  sc::stream s;
  const std::vector<std::uint64_t> keys{5, 6, 5};
  const std::vector<std::uint64_t> written{5};
  const std::vector<float> grads(8, 1.0f);
  for (const bool invalidate : {true, false}) {
    CAPTURE(invalidate);
    vector_storage storage({{"t", 50, 8}});
    sc::row_cache<vector_storage> cache(storage, 8, never_stale, s,
                                        {.invalidate_on_write = invalidate});
    const std::vector<float> old_rows = storage.expected(0, keys);
    cuda_test::require_bits_equal(cached_gather(cache, 0, keys, 0, s), old_rows);
    cache.apply_gradients(0, written, matrix_view<const float>(grads.data(), 1, 8));
    const std::vector<float> new_rows = storage.expected(0, keys);
    REQUIRE(new_rows != old_rows);
    const std::uint64_t before = storage.rows_gathered;
    const std::vector<float> got = cached_gather(cache, 0, keys, 0, s);
    if (invalidate) {
      cuda_test::require_bits_equal(got, new_rows);
      CHECK(storage.rows_gathered - before == 1);  // only row 5; row 6 still cached
      CHECK(cache.stats(0).invalidations == 1);
    } else {
      cuda_test::require_bits_equal(got, old_rows);  // unbounded staleness: the old row stays
      CHECK(storage.rows_gathered == before);
      CHECK(cache.invalidate(0, written) == 1);  // explicit invalidation refetches
      cuda_test::require_bits_equal(cached_gather(cache, 0, keys, 0, s), new_rows);
    }
    cache.clear();
    cuda_test::require_bits_equal(cached_gather(cache, 0, keys, 1, s), new_rows);
  }
}

TEST_CASE("row_cache: errors name the table and leave the cache usable", "[cuda][cache]") {
  if (skip_without_gpu()) return;
  sc::stream s;
  vector_storage storage({{"users", 100, 4}, {"items", 20, 3}});
  sc::row_cache<vector_storage> cache(storage, 4, 1, s);

  // More distinct keys than the capacity: refused before anything changes.
  const std::vector<std::uint64_t> big{1, 2, 3, 4, 5, 1};
  auto out = cuda_test::poisoned(big.size() * 4, s);
  strata::error e = catch_error([&] { cache.gather(0, big, out.data(), 0); });
  CHECK(e.code() == errc::invalid_argument);
  CAPTURE(std::string(e.what()));
  CHECK(contains(e.what(), "table 0 'users'"));
  CHECK(contains(e.what(), "5 distinct keys"));
  CHECK(contains(e.what(), "only 4 rows"));
  CHECK(contains(e.what(), "raise the cache capacity"));
  CHECK(storage.gather_calls == 0);
  const std::vector<std::uint64_t> ok{1, 2, 3, 4, 1};
  cuda_test::require_bits_equal(cached_gather(cache, 0, ok, 0, s), storage.expected(0, ok));

  // A table that does not exist.
  e = catch_error([&] { cache.gather(2, ok, out.data(), 0); });
  CHECK(e.code() == errc::out_of_range);
  CHECK(contains(e.what(), "table 2"));
  CHECK_THROWS_AS(cache.stats(7), strata::error);

  // An output of the wrong size (the span overload checks it).
  e = catch_error([&] { cache.gather(1, ok, out.span(), 0); });
  CHECK(e.code() == errc::size_mismatch);
  CHECK(contains(e.what(), "table 1 'items'"));
  CHECK(contains(e.what(), "5 x 3"));
  auto exact = cuda_test::poisoned(ok.size() * 3, s);
  cache.gather(1, ok, exact.span(), 0);
  cuda_test::require_bits_equal(exact.download(), storage.expected(1, ok));
  REQUIRE(cache.invalidate(1, ok) == 4);

  // Gradients of the wrong shape.
  const std::vector<float> grads(2 * 4, 0.5f);
  e = catch_error(
      [&] { cache.apply_gradients(1, ok, matrix_view<const float>(grads.data(), 2, 4)); });
  CHECK(e.code() == errc::size_mismatch);
  CHECK(contains(e.what(), "table 1 'items'"));

  // The backing refuses a key: the error propagates, and the batch's valid keys are not left
  // behind as cached rows that never arrived.
  const std::vector<std::uint64_t> bad{7, 25, 8};
  e = catch_error([&] { cache.gather(1, bad, out.data(), 0); });
  CHECK(e.code() == errc::out_of_range);
  CHECK(contains(e.what(), "key 25"));
  CHECK(cache.directory(1).size() == 0);
  const std::vector<std::uint64_t> good{7, 8, 7};
  cuda_test::require_bits_equal(cached_gather(cache, 1, good, 0, s), storage.expected(1, good));

  // One capacity per table.
  e = catch_error(
      [&] { sc::row_cache<vector_storage> wrong(storage, std::vector<std::size_t>{4}, 0, s); });
  CHECK(e.code() == errc::size_mismatch);
  cache.synchronize();
}

// cache_directory against a naive reference model (std::map + std::list LRU) and against
// properties that do not depend on the model.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <list>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "strata/embedding/cache_directory.hpp"
#include "support/catch_error.hpp"
#include "support/skip.hpp"

using strata_test::catch_error;
using strata_test::contains;

using namespace strata;
using namespace strata::embedding;

namespace {

constexpr std::uint64_t never_stale = std::numeric_limits<std::uint64_t>::max();

/// The documented policy, written the slow, obvious way.
class reference {
 public:
  struct result {
    std::vector<std::uint32_t> slots;
    std::vector<std::uint64_t> fetch_keys;
    std::vector<std::uint32_t> fetch_slots;
  };

  reference(std::size_t capacity, std::uint64_t max_staleness)
      : capacity_(capacity), max_staleness_(max_staleness), holder_(capacity) {
    reset_order();
  }

  /// nullopt when the batch has more distinct keys than the capacity (nothing changes).
  std::optional<result> plan(const std::vector<std::uint64_t>& keys, std::uint64_t step) {
    std::vector<std::uint64_t> cached_keys, absent_keys;
    std::set<std::uint64_t> seen;
    for (const std::uint64_t k : keys)
      if (seen.insert(k).second) (cached_.count(k) != 0 ? cached_keys : absent_keys).push_back(k);
    if (seen.size() > capacity_) return std::nullopt;
    result r;
    for (const std::uint64_t k : cached_keys) {
      entry& e = cached_.at(k);
      touch(e.slot);
      if (step >= e.fetched && step - e.fetched <= max_staleness_) {
        ++stats.hits;
      } else {
        e.fetched = step;
        r.fetch_keys.push_back(k);
        r.fetch_slots.push_back(e.slot);
      }
    }
    for (const std::uint64_t k : absent_keys) {
      const std::uint32_t s = order_.front();
      if (holder_[s]) {
        cached_.erase(*holder_[s]);
        ++stats.evictions;
      }
      holder_[s] = k;
      cached_[k] = {s, step};
      touch(s);
      r.fetch_keys.push_back(k);
      r.fetch_slots.push_back(s);
    }
    for (const std::uint64_t k : keys)
      r.slots.push_back(cached_.at(k).slot);
    stats.lookups += keys.size();
    stats.misses += r.fetch_keys.size();
    return r;
  }

  void invalidate(const std::vector<std::uint64_t>& keys) {
    for (const std::uint64_t k : keys) {
      const auto it = cached_.find(k);
      if (it == cached_.end()) continue;
      const std::uint32_t s = it->second.slot;
      cached_.erase(it);
      holder_[s].reset();
      order_.remove(s);
      order_.push_front(s);
      ++stats.invalidations;
    }
  }

  void clear() {
    stats.invalidations += cached_.size();
    cached_.clear();
    for (auto& h : holder_)
      h.reset();
    reset_order();
  }

  [[nodiscard]] std::size_t size() const { return cached_.size(); }

  cache_stats stats;

 private:
  struct entry {
    std::uint32_t slot = 0;
    std::uint64_t fetched = 0;
  };
  void touch(std::uint32_t s) {
    order_.remove(s);
    order_.push_back(s);
  }
  void reset_order() {
    order_.clear();
    for (std::uint32_t s = 0; s < capacity_; ++s)
      order_.push_back(s);
  }

  std::size_t capacity_;
  std::uint64_t max_staleness_;
  std::map<std::uint64_t, entry> cached_;
  std::list<std::uint32_t> order_;  // front: least recently used (free slots first)
  std::vector<std::optional<std::uint64_t>> holder_;
};

std::vector<std::uint32_t> to_vector(std::span<const std::uint32_t> s) {
  return {s.begin(), s.end()};
}
std::vector<std::uint64_t> to_vector(std::span<const std::uint64_t> s) {
  return {s.begin(), s.end()};
}

void require_same_stats(const cache_stats& a, const cache_stats& b) {
  CHECK(a.lookups == b.lookups);
  CHECK(a.hits == b.hits);
  CHECK(a.misses == b.misses);
  CHECK(a.evictions == b.evictions);
  CHECK(a.invalidations == b.invalidations);
}

/// Properties of one successful plan that hold whatever the eviction order: checked against
/// the directory's state before (`before_slot`, `before_fetched` per distinct key) and after.
void check_properties(const cache_directory& dir, const std::vector<std::uint64_t>& keys,
                      std::uint64_t step, const std::map<std::uint64_t, std::uint32_t>& before_slot,
                      const std::map<std::uint64_t, std::uint64_t>& before_fetched,
                      const cache_plan& p) {
  REQUIRE(p.slots.size() == keys.size());
  REQUIRE(p.fetch_keys.size() == p.fetch_slots.size());
  // Per-element checks fail through FAIL only: a passing REQUIRE still records an assertion
  // with the CAPTURE'd context, which in these loops was 90% of the run under ASan.
  // Every returned slot holds its key (so distinct keys never share a slot).
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (p.slots[i] >= dir.capacity() || !dir.occupied(p.slots[i]) ||
        dir.key_at(p.slots[i]) != keys[i])
      FAIL("key " << keys[i] << " (batch position " << i << ") got slot " << p.slots[i]
                  << ", which does not hold it (capacity " << dir.capacity() << ")");
  // The fetch list is exactly the distinct keys that were absent or too old, each once.
  std::set<std::uint64_t> expected;
  for (const auto& [key, slot] : before_slot) {
    const std::uint64_t f = before_fetched.at(key);
    const bool fresh =
        slot != cache_directory::no_slot && step >= f && step - f <= dir.max_staleness();
    if (!fresh) expected.insert(key);
  }
  const std::set<std::uint64_t> fetched(p.fetch_keys.begin(), p.fetch_keys.end());
  REQUIRE(fetched.size() == p.fetch_keys.size());
  REQUIRE(fetched == expected);
  // No slot receives two rows; each fetched slot now holds its key, fetched at `step`.
  const std::set<std::uint32_t> fetch_slots(p.fetch_slots.begin(), p.fetch_slots.end());
  REQUIRE(fetch_slots.size() == p.fetch_slots.size());
  for (std::size_t j = 0; j < p.fetch_keys.size(); ++j)
    if (dir.key_at(p.fetch_slots[j]) != p.fetch_keys[j] ||
        dir.fetched_step(p.fetch_slots[j]) != step)
      FAIL("fetched key " << p.fetch_keys[j] << " in slot " << p.fetch_slots[j]
                          << ": the slot holds " << dir.key_at(p.fetch_slots[j])
                          << " fetched at step " << dir.fetched_step(p.fetch_slots[j])
                          << ", not step " << step);
  // Rows of this batch that were cached stay in their slots (a batch never evicts its own).
  for (const auto& [key, slot] : before_slot)
    if (slot != cache_directory::no_slot && dir.find(key) != slot)
      FAIL("key " << key << " moved from slot " << slot << " to " << dir.find(key));
  REQUIRE(dir.size() <= dir.capacity());
}

struct stream_params {
  std::size_t capacity;
  std::uint64_t staleness;
  std::uint64_t universe;
  std::size_t max_batch;
};

void run_random_stream(const stream_params& prm, std::uint64_t seed) {
  CAPTURE(prm.capacity, prm.staleness, prm.universe, prm.max_batch, seed);
  std::mt19937_64 gen(seed);
  cache_directory dir(prm.capacity, prm.staleness);
  reference ref(prm.capacity, prm.staleness);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::uniform_int_distribution<std::size_t> batch_len(0, prm.max_batch);
  std::uint64_t step = 5;
  std::size_t plans = 0, refused = 0;
  for (int call = 0; call < 400; ++call) {
    CAPTURE(call, step);
    const double action = u01(gen);
    if (action < 0.08) {  // invalidate some keys (cached or not)
      std::vector<std::uint64_t> keys(batch_len(gen) / 2);
      for (auto& k : keys)
        k = static_cast<std::uint64_t>(u01(gen) * static_cast<double>(prm.universe));
      ref.invalidate(keys);
      dir.invalidate(keys);
    } else if (action < 0.09) {
      ref.clear();
      dir.clear();
    } else {
      // Mostly skewed keys (u³ favours small ids: hot rows, many duplicates); sometimes
      // uniform ones (more distinct keys, so some batches exceed the capacity).
      std::vector<std::uint64_t> keys(batch_len(gen));
      const bool uniform = u01(gen) < 0.1;
      for (auto& k : keys) {
        const double x = u01(gen);
        k = static_cast<std::uint64_t>((uniform ? x : x * x * x) *
                                       static_cast<double>(prm.universe));
      }
      std::map<std::uint64_t, std::uint32_t> before_slot;
      std::map<std::uint64_t, std::uint64_t> before_fetched;
      for (const std::uint64_t k : keys) {
        const std::uint32_t s = dir.find(k);
        before_slot[k] = s;
        before_fetched[k] = s == cache_directory::no_slot ? 0 : dir.fetched_step(s);
      }
      const auto want = ref.plan(keys, step);
      if (!want) {
        const cache_stats stats_before = dir.stats();
        const std::size_t size_before = dir.size();
        const error e = catch_error([&] { (void)dir.plan(keys, step); });
        CHECK(e.code() == errc::invalid_argument);
        require_same_stats(dir.stats(), stats_before);
        REQUIRE(dir.size() == size_before);
        ++refused;
      } else {
        const cache_plan got = dir.plan(keys, step);
        check_properties(dir, keys, step, before_slot, before_fetched, got);
        REQUIRE(to_vector(got.slots) == want->slots);
        REQUIRE(to_vector(got.fetch_keys) == want->fetch_keys);
        REQUIRE(to_vector(got.fetch_slots) == want->fetch_slots);
        ++plans;
      }
      // Mostly forward by 0–2 steps; rarely backwards (a restarted step counter).
      const double move = u01(gen);
      if (move < 0.02 && step > 3)
        step -= 3;
      else
        step += static_cast<std::uint64_t>(move * 3.0);
    }
    REQUIRE(dir.size() == ref.size());
    require_same_stats(dir.stats(), ref.stats);
  }
  CHECK(plans > 100);
  if (prm.max_batch > prm.capacity && prm.universe > prm.capacity) CHECK(refused > 0);
}

}  // namespace

TEST_CASE("cache_directory: slot_map finds, inserts and erases like std::map",
          "[embedding][cache]") {
  std::mt19937_64 gen(11);
  for (const std::size_t capacity : {1u, 5u, 100u}) {
    embedding::detail::slot_map map(capacity);
    std::map<std::uint64_t, std::uint32_t> want;
    // Keys that collide often: a small universe plus huge values.
    std::uniform_int_distribution<std::uint64_t> pick(0, 3 * capacity + 3);
    for (int i = 0; i < 20000; ++i) {
      const std::uint64_t key = pick(gen) * 0x100000001ull;
      if (want.count(key) != 0) {
        REQUIRE(map.erase(key));
        want.erase(key);
      } else if (want.size() < capacity) {
        const auto slot = static_cast<std::uint32_t>(i);
        map.insert(key, slot);
        want[key] = slot;
      } else {
        REQUIRE_FALSE(map.erase(key));
      }
      if (i % 97 == 0)
        for (std::uint64_t k = 0; k <= 3 * capacity + 3; ++k) {
          const std::uint64_t key2 = k * 0x100000001ull;
          const auto it = want.find(key2);
          REQUIRE(map.find(key2) ==
                  (it == want.end() ? embedding::detail::slot_map::npos : it->second));
        }
    }
  }
}

TEST_CASE("cache_directory: random key streams match the reference model", "[embedding][cache]") {
  const std::uint64_t seed = std::random_device{}();
  // Sanitizer builds (-O0, ASan: 37 s, four fifths of it at capacity 300) stop at 64.
  const std::vector<std::size_t> capacities = strata_test::sanitized()
                                                  ? std::vector<std::size_t>{1, 2, 7, 64}
                                                  : std::vector<std::size_t>{1, 2, 7, 64, 300};
  for (const std::size_t capacity : capacities)
    for (const std::uint64_t staleness :
         {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{3}, never_stale}) {
      // Working set smaller than, about, and much larger than the cache.
      run_random_stream({capacity, staleness, capacity / 2 + 1, capacity}, seed);
      run_random_stream({capacity, staleness, 2 * capacity + 1, capacity}, seed + 1);
      run_random_stream({capacity, staleness, 10 * capacity + 5, capacity + capacity / 2 + 1},
                        seed + 2);
    }
}

TEST_CASE("cache_directory: duplicates inside one batch are fetched once", "[embedding][cache]") {
  cache_directory dir(8, 0);
  const std::vector<std::uint64_t> keys{5, 5, 9, 5, 9, 1};
  const cache_plan p = dir.plan(keys, 0);
  CHECK(to_vector(p.fetch_keys) == std::vector<std::uint64_t>{5, 9, 1});
  CHECK(to_vector(p.fetch_slots) == std::vector<std::uint32_t>{0, 1, 2});
  CHECK(to_vector(p.slots) == std::vector<std::uint32_t>{0, 0, 1, 0, 1, 2});
  CHECK(dir.stats().lookups == 6);
  CHECK(dir.stats().misses == 3);
  CHECK(dir.stats().hits == 0);
  // The same batch again in the same step: all hits, nothing fetched, same slots.
  const cache_plan q = dir.plan(keys, 0);
  CHECK(q.fetch_keys.empty());
  CHECK(to_vector(q.slots) == std::vector<std::uint32_t>{0, 0, 1, 0, 1, 2});
  CHECK(dir.stats().hits == 3);
  // An empty batch plans nothing.
  const cache_plan e = dir.plan({}, 0);
  CHECK(e.slots.empty());
  CHECK(e.fetch_keys.empty());
}

TEST_CASE("cache_directory: a row of age S hits, of age S + 1 is refetched", "[embedding][cache]") {
  const std::vector<std::uint64_t> key{7};
  SECTION("S = 3") {
    cache_directory dir(4, 3);
    CHECK(dir.plan(key, 10).fetch_keys.size() == 1);
    for (const std::uint64_t step : {10u, 11u, 12u, 13u})
      CHECK(dir.plan(key, step).fetch_keys.empty());
    const cache_plan p = dir.plan(key, 14);
    REQUIRE(p.fetch_keys.size() == 1);
    CHECK(p.fetch_slots[0] == p.slots[0]);  // refetched into its own slot
    CHECK(dir.fetched_step(p.slots[0]) == 14);
    CHECK(dir.plan(key, 17).fetch_keys.empty());
    CHECK(dir.plan(key, 18).fetch_keys.size() == 1);
    CHECK(dir.stats().evictions == 0);
  }
  SECTION("S = 0 reuses rows only within the step that fetched them (pass-through)") {
    cache_directory dir(4, 0);
    CHECK(dir.plan(key, 1).fetch_keys.size() == 1);
    CHECK(dir.plan(key, 1).fetch_keys.empty());
    CHECK(dir.plan(key, 2).fetch_keys.size() == 1);
    CHECK(dir.plan(key, 3).fetch_keys.size() == 1);
    CHECK(dir.stats().hits == 1);
    CHECK(dir.stats().misses == 3);
  }
  SECTION("unbounded staleness never refetches") {
    cache_directory dir(4, never_stale);
    CHECK(dir.plan(key, 1).fetch_keys.size() == 1);
    CHECK(dir.plan(key, 1'000'000'000'000ull).fetch_keys.empty());
  }
  SECTION("a step before the fetch step refetches") {
    cache_directory dir(4, 5);
    CHECK(dir.plan(key, 10).fetch_keys.size() == 1);
    CHECK(dir.plan(key, 9).fetch_keys.size() == 1);
    CHECK(dir.fetched_step(dir.find(7)) == 9);
  }
}

TEST_CASE("cache_directory: evicts the least recently used row the batch does not use",
          "[embedding][cache]") {
  cache_directory dir(3, never_stale);
  CHECK(to_vector(dir.plan(std::vector<std::uint64_t>{1, 2, 3}, 0).slots) ==
        std::vector<std::uint32_t>{0, 1, 2});
  (void)dir.plan(std::vector<std::uint64_t>{1}, 1);  // recency now 2, 3, 1
  cache_plan p = dir.plan(std::vector<std::uint64_t>{4}, 2);
  CHECK(to_vector(p.fetch_slots) == std::vector<std::uint32_t>{1});  // 2 evicted
  CHECK(dir.find(2) == cache_directory::no_slot);
  // Recency 3, 1, 4. The batch {5, 3} uses 3, so 1 (slot 0) goes, although 3 was older.
  p = dir.plan(std::vector<std::uint64_t>{5, 3}, 3);
  CHECK(to_vector(p.fetch_keys) == std::vector<std::uint64_t>{5});
  CHECK(to_vector(p.slots) == std::vector<std::uint32_t>{0, 2});
  CHECK(dir.find(1) == cache_directory::no_slot);
  CHECK(dir.stats().evictions == 2);
  // A full cache and a batch of its two oldest rows plus a new one: the newest row goes.
  // Recency 4, 3, 5 (slots 1, 2, 0).
  p = dir.plan(std::vector<std::uint64_t>{4, 3, 6}, 4);
  CHECK(to_vector(p.slots) == std::vector<std::uint32_t>{1, 2, 0});
  CHECK(dir.find(5) == cache_directory::no_slot);
  CHECK(dir.size() == 3);
}

TEST_CASE("cache_directory: same calls give the same slots", "[embedding][cache]") {
  std::mt19937_64 gen(3);
  cache_directory a(50, 2), b(50, 2);
  std::uniform_int_distribution<std::uint64_t> key(0, 400);
  for (std::uint64_t step = 0; step < 200; ++step) {
    std::vector<std::uint64_t> keys(40);
    for (auto& k : keys)
      k = key(gen);
    const cache_plan pa = a.plan(keys, step);
    const cache_plan pb = b.plan(keys, step);
    REQUIRE(to_vector(pa.slots) == to_vector(pb.slots));
    REQUIRE(to_vector(pa.fetch_slots) == to_vector(pb.fetch_slots));
  }
  CHECK(a.stats().evictions > 0);
}

TEST_CASE("cache_directory: invalidate forgets keys; their slots are reused first",
          "[embedding][cache]") {
  cache_directory dir(4, never_stale);
  (void)dir.plan(std::vector<std::uint64_t>{1, 2, 3, 4}, 0);
  CHECK(dir.invalidate(std::vector<std::uint64_t>{2, 99, 2}) == 1);
  CHECK(dir.find(2) == cache_directory::no_slot);
  CHECK(dir.size() == 3);
  CHECK(dir.stats().invalidations == 1);
  // 5 takes the freed slot 1 without evicting anything.
  cache_plan p = dir.plan(std::vector<std::uint64_t>{5}, 0);
  CHECK(to_vector(p.fetch_slots) == std::vector<std::uint32_t>{1});
  CHECK(dir.stats().evictions == 0);
  // 2 is refetched (same step, unbounded staleness: only invalidation explains the miss); the
  // cache is full, so the least recently used row (1, slot 0) is evicted.
  p = dir.plan(std::vector<std::uint64_t>{2}, 0);
  CHECK(to_vector(p.fetch_keys) == std::vector<std::uint64_t>{2});
  CHECK(to_vector(p.fetch_slots) == std::vector<std::uint32_t>{0});
  CHECK(dir.stats().evictions == 1);
  // Invalidating through the plan's own view (as row_cache does after a failed fetch).
  p = dir.plan(std::vector<std::uint64_t>{7, 8}, 1);
  CHECK(dir.invalidate(p.fetch_keys) == 2);
  CHECK(dir.find(7) == cache_directory::no_slot);
  CHECK(dir.find(8) == cache_directory::no_slot);
  // clear: back to the initial slot order.
  dir.clear();
  CHECK(dir.size() == 0);
  CHECK(dir.stats().invalidations == 3 + 2);
  p = dir.plan(std::vector<std::uint64_t>{40, 41}, 2);
  CHECK(to_vector(p.fetch_slots) == std::vector<std::uint32_t>{0, 1});
}

TEST_CASE("cache_directory: a batch larger than the capacity is refused, naming the numbers",
          "[embedding][cache]") {
  cache_directory dir(4, 0, "cuda::row_cache table 1 'items'");
  cache_directory twin(4, 0);
  const std::vector<std::uint64_t> warm{1, 2, 3};
  (void)dir.plan(warm, 0);
  (void)twin.plan(warm, 0);
  const std::vector<std::uint64_t> big{1, 2, 2, 7, 8, 1, 9, 9, 7};  // 5 distinct, 2 cached
  const error e = catch_error([&] { (void)dir.plan(big, 1); });
  CHECK(e.code() == errc::invalid_argument);
  const std::string what = e.what();
  CAPTURE(what);
  CHECK(contains(what, "cuda::row_cache table 1 'items'"));
  CHECK(contains(what, "9 keys"));
  CHECK(contains(what, "5 distinct keys"));
  CHECK(contains(what, "only 4 rows"));
  CHECK(contains(what, "raise the cache capacity"));
  // Nothing changed: the directory goes on exactly like one that never saw the batch.
  for (std::uint64_t step = 1; step < 5; ++step) {
    const std::vector<std::uint64_t> keys{step + 10, 2, step + 20};
    REQUIRE(to_vector(dir.plan(keys, step).fetch_slots) ==
            to_vector(twin.plan(keys, step).fetch_slots));
  }
  require_same_stats(dir.stats(), twin.stats());
  // Capacity must be at least 1.
  const error zero = catch_error([] { cache_directory bad(0, 0, "my cache"); });
  CHECK(zero.code() == errc::invalid_argument);
  CHECK(contains(zero.what(), "my cache"));
}

TEST_CASE("cache_directory: no allocation once the buffers fit the largest batch",
          "[embedding][cache]") {
  cache_directory dir(100, 1);
  std::vector<std::uint64_t> keys(500);
  for (std::size_t i = 0; i < keys.size(); ++i)
    keys[i] = i % 90;
  const cache_plan first = dir.plan(keys, 0);
  const std::size_t bytes = dir.memory_bytes();
  for (std::uint64_t step = 1; step < 20; ++step) {
    for (std::size_t i = 0; i < keys.size(); ++i)
      keys[i] = (i * 7 + step * 13) % 95;
    const cache_plan p = dir.plan(std::span<const std::uint64_t>(keys).first(400 + step), step);
    CHECK(p.slots.data() == first.slots.data());
    CHECK(p.fetch_keys.data() == first.fetch_keys.data());
    CHECK(p.fetch_slots.data() == first.fetch_slots.data());
  }
  CHECK(dir.memory_bytes() == bytes);
}

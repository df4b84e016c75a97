#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "strata/core/row_store.hpp"
#include "support/catch_error.hpp"

using namespace strata;
using strata_test::catch_error;

namespace {
/// A filler that writes (key + c) / 8 into column c and counts its calls per key.
struct counting_fill {
  std::map<std::uint64_t, int>* calls;
  void operator()(std::uint64_t key, std::span<float> weights) const {
    ++(*calls)[key];
    for (std::size_t c = 0; c < weights.size(); ++c)
      weights[c] = static_cast<float>(key % 1000 + c) / 8.0f;
  }
};

bool row_is(std::span<const float> weights, std::uint64_t key) {
  for (std::size_t c = 0; c < weights.size(); ++c)
    if (weights[c] != static_cast<float>(key % 1000 + c) / 8.0f) return false;
  return true;
}

bool all_zero(std::span<const float> values) {
  for (const float v : values)
    if (v != 0.0f) return false;
  return true;
}
}  // namespace

TEST_CASE("row_store creates a row once per key: filled with its key, state zero",
          "[core][row_store]") {
  row_store store(3, 2, 4);  // first chunk of 4 rows
  REQUIRE(store.empty());
  REQUIRE(store.dim() == 3);
  REQUIRE(store.state_floats() == 2);
  REQUIRE(store.row_floats() == 5);
  REQUIRE(store.first_chunk_rows() == 4);
  REQUIRE(row_store::chunk_rows == 1024);
  std::map<std::uint64_t, int> calls;
  const counting_fill fill{&calls};
  const std::vector<std::uint64_t> keys{7, ~std::uint64_t{0}, 0, 7, 123456789012345ull, 0, 9};
  std::vector<std::uint64_t> order;  // first appearances
  for (const std::uint64_t key : keys) {
    const bool fresh = store.find(key) == row_store::npos;
    const auto [slot, created] = store.find_or_create(key, fill);
    CHECK(created == fresh);
    if (fresh) order.push_back(key);
    CHECK(store.keys()[slot] == key);
    CHECK(slot < store.size());
  }
  REQUIRE(store.size() == order.size());
  REQUIRE(calls.size() == order.size());
  for (std::uint64_t slot = 0; slot < order.size(); ++slot) {
    CHECK(calls[order[slot]] == 1);
    CHECK(store.find(order[slot]) == slot);  // slots dense, in creation order
    const auto row = store.row(slot);
    REQUIRE(row.weights.size() == 3);
    REQUIRE(row.state.size() == 2);
    CHECK(row.weights.data() == store.data(slot));
    CHECK(row.state.data() == store.data(slot) + 3);  // state right after the weights
    CHECK(row_is(row.weights, order[slot]));
    CHECK(all_zero(row.state));
  }
}

TEST_CASE("row_store: find of a missing key is npos and creates nothing", "[core][row_store]") {
  row_store store(4, 0);
  CHECK(store.find(0) == row_store::npos);
  CHECK(store.find(~std::uint64_t{0}) == row_store::npos);
  std::map<std::uint64_t, int> calls;
  store.find_or_create(5, counting_fill{&calls});
  CHECK(store.find(6) == row_store::npos);
  CHECK(store.size() == 1);
  CHECK(store.row(0).state.empty());
  CHECK(std::as_const(store).row(0).weights.size() == 4);
}

TEST_CASE("row_store references stay valid while it grows", "[core][row_store]") {
  // Chunks of 4, 4, 8, …, 512 rows, then 1024: rows in both kinds of chunk, and the store goes
  // from one chunk to many.
  row_store store(2, 1, 4);
  std::map<std::uint64_t, int> calls;
  const counting_fill fill{&calls};
  store.find_or_create(1000, fill);
  float* first = store.data(0);
  const auto first_row = store.row(0);
  first_row.state[0] = 42.0f;
  std::vector<float*> pointers;
  for (std::uint64_t key = 0; key < 5000; ++key) {
    const auto [slot, created] = store.find_or_create(key * 7919, fill);
    REQUIRE(created);
    pointers.push_back(store.data(slot));
  }
  REQUIRE(store.size() == 5001);
  CHECK(store.data(0) == first);
  CHECK(store.row(0).weights.data() == first_row.weights.data());
  CHECK(first_row.state[0] == 42.0f);
  CHECK(row_is(first_row.weights, 1000));
  for (std::uint64_t key = 0; key < 5000; ++key) {
    REQUIRE(store.data(key + 1) == pointers[key]);
    REQUIRE(row_is(std::span<const float>(pointers[key], 2), key * 7919));
  }
}

TEST_CASE("row_store rows never overlap, whatever the chunk sizes", "[core][row_store]") {
  const std::size_t first = GENERATE(std::size_t{1}, std::size_t{2}, std::size_t{4},
                                     std::size_t{64}, std::size_t{row_store::chunk_rows});
  row_store store(3, 2, first);
  CHECK(store.first_chunk_rows() == first);
  const auto zero = [](std::uint64_t, std::span<float>) {};
  const std::size_t rows = 3000;
  for (std::uint64_t key = 0; key < rows; ++key)
    store.find_or_create(key, zero);
  for (std::uint64_t slot = 0; slot < rows; ++slot)
    for (std::size_t c = 0; c < 5; ++c)
      store.data(slot)[c] = static_cast<float>(slot * 5 + c);
  for (std::uint64_t slot = 0; slot < rows; ++slot)
    for (std::size_t c = 0; c < 5; ++c)
      REQUIRE(store.data(slot)[c] == static_cast<float>(slot * 5 + c));
}

TEST_CASE("row_store copies are deep and moves keep the rows in place", "[core][row_store]") {
  const std::size_t first_chunk =
      GENERATE(std::size_t{row_store::chunk_rows}, std::size_t{4});  // 1 chunk; several
  row_store store(2, 2, first_chunk);
  std::map<std::uint64_t, int> calls;
  for (std::uint64_t key = 0; key < 10; ++key)  // rows in the first chunk and in later ones
    store.find_or_create(key, counting_fill{&calls});
  row_store copy(store);
  copy.row(0).state[0] = 5.0f;
  copy.row(9).weights[1] = 7.0f;
  CHECK(store.row(0).state[0] == 0.0f);
  CHECK(row_is(store.row(9).weights, 9));
  CHECK(copy.data(0) != store.data(0));
  CHECK(copy.size() == store.size());
  CHECK(copy.find(9) == 9);
  const float* first = store.data(0);
  const float* last = store.data(9);
  row_store moved(std::move(store));
  CHECK(moved.data(0) == first);
  CHECK(moved.data(9) == last);
  copy = moved;  // copy assignment: deep again
  CHECK(copy.data(0) != moved.data(0));
  CHECK(copy.row(0).state[0] == 0.0f);
  CHECK(row_is(copy.row(9).weights, 9));
}

TEST_CASE("row_store with uniform_init writes uniform_init's row", "[core][row_store]") {
  const uniform_init init{.seed = 5, .scale = 0.5f};
  row_store store(6, 6);
  const auto [slot, created] = store.find_or_create(77, init, 3);
  REQUIRE(created);
  std::vector<float> expected(6);
  init.fill(3, 77, expected);
  const auto row = store.row(slot);
  CHECK(std::memcmp(row.weights.data(), expected.data(), 6 * sizeof(float)) == 0);
  CHECK(all_zero(row.state));
  std::vector<std::uint64_t> slots(2);
  store.resolve(std::vector<std::uint64_t>{78, 77}, slots, init, 3);
  CHECK(slots[1] == slot);
  init.fill(3, 78, expected);
  CHECK(std::memcmp(store.data(slots[0]), expected.data(), 6 * sizeof(float)) == 0);
}

TEST_CASE("row_store::resolve equals find_or_create key by key, serial and parallel",
          "[core][row_store]") {
  // 2 000 keys stay serial; 50 000 (≥ 4096 lookups, ≥ 1024 new rows) run tbb-parallel.
  const std::size_t n = GENERATE(std::size_t{2'000}, std::size_t{50'000});
  std::mt19937_64 rng(3);
  std::vector<std::uint64_t> keys(n);
  for (auto& k : keys)
    k = rng() % (n / 2) * 0x9E3779B97F4A7C15ull;  // duplicates, spread over 64 bits
  const auto fill = [](std::uint64_t key, std::span<float> w) {
    for (std::size_t c = 0; c < w.size(); ++c)
      w[c] = static_cast<float>((key >> (c * 8)) & 0xFF);
  };
  row_store batched(4, 4, 64), single(4, 4, 64);
  std::atomic<int> fills{0};
  const auto counted = [&](std::uint64_t key, std::span<float> w) {
    fills.fetch_add(1, std::memory_order_relaxed);
    fill(key, w);
  };
  // Half the keys exist before the batch (found, not created, by resolve).
  for (std::size_t i = 0; i < n / 4; ++i)
    batched.find_or_create(keys[i], counted);
  std::vector<std::uint64_t> slots(n);
  batched.resolve(keys, slots, counted);
  for (std::size_t i = 0; i < n / 4; ++i)
    single.find_or_create(keys[i], fill);
  for (std::size_t i = 0; i < n; ++i)
    REQUIRE(slots[i] == single.find_or_create(keys[i], fill).first);
  REQUIRE(batched.size() == single.size());
  CHECK(fills.load() == static_cast<int>(batched.size()));  // once per row
  for (std::uint64_t slot = 0; slot < single.size(); ++slot) {
    REQUIRE(batched.keys()[slot] == single.keys()[slot]);
    REQUIRE(std::memcmp(batched.data(slot), single.data(slot), 8 * sizeof(float)) == 0);
  }
}

TEST_CASE("row_store::for_each visits every key once with its row, in slot order",
          "[core][row_store]") {
  row_store store(2, 3, 8);  // first chunk of 8 rows
  std::map<std::uint64_t, int> calls;
  const counting_fill fill{&calls};
  for (std::uint64_t key = 0; key < 100; ++key)
    store.find_or_create((key * 37) % 61 + 1000 * (key % 3), fill);
  store.row(4).state[2] = -1.0f;
  std::vector<std::uint64_t> seen;
  store.for_each(
      [&](std::uint64_t key, std::span<const float> weights, std::span<const float> state) {
        const std::uint64_t slot = seen.size();
        seen.push_back(key);
        CHECK(weights.data() == store.data(slot));
        CHECK(row_is(weights, key));
        REQUIRE(state.size() == 3);
        CHECK(state[2] == (slot == 4 ? -1.0f : 0.0f));
      });
  REQUIRE(seen.size() == store.size());
  CHECK(std::equal(seen.begin(), seen.end(), store.keys().begin(), store.keys().end()));
  std::map<std::uint64_t, int> once;
  for (const auto key : seen)
    ++once[key];
  CHECK(once.size() == seen.size());
}

TEST_CASE("row_store::bytes is its index, its keys and its chunks", "[core][row_store]") {
  const std::size_t dim = 5, state = 3, row_bytes = (dim + state) * sizeof(float);
  row_store store(dim, state, 4), fixed(dim, state);
  CHECK(store.bytes() == 0);
  std::map<std::uint64_t, int> calls;
  // Rows held → rows allocated: chunks of 4, 4, 8, …, 512 rows, then of 1024; or all of 1024.
  const std::vector<std::array<std::size_t, 3>> capacity{
      {1, 4, 1024},       {4, 4, 1024},       {5, 8, 1024},       {9, 16, 1024},
      {1024, 1024, 1024}, {1025, 2048, 2048}, {3000, 3072, 3072}, {20000, 20480, 20480}};
  for (const auto& [rows, growing, all_full] : capacity) {
    while (store.size() < rows) {
      const std::uint64_t key = store.size() * 1'000'003ull;
      store.find_or_create(key, counting_fill{&calls});
      fixed.find_or_create(key, counting_fill{&calls});
    }
    // The same keys in the same order: the same index and keys; the chunks differ.
    const std::size_t index = fixed.bytes() - all_full * row_bytes;
    CHECK(store.bytes() == index + growing * row_bytes);
    // Index: 4-byte entries, 30–65% free (at least 16); keys: 8 bytes each (+ vector growth).
    const auto r = static_cast<double>(rows);
    CHECK(static_cast<double>(index) >= 8 * r + 4 * r / 0.7);
    CHECK(static_cast<double>(index) <= 16 * r + 4 * std::max(16.0, 2 * r / 0.7));
  }
}

TEST_CASE("row_store matches a std::unordered_map reference on random keys", "[core][row_store]") {
  // Random keys (64-bit, and from a small range so that many repeat), through find,
  // find_or_create and resolve in random order; the reference is a map key → slot, the
  // creation order and every row's expected floats. Rows are written between calls, and every
  // row's address is recorded when created: slots, contents and addresses must all hold while
  // the store grows from one chunk to many (and its index from 16 entries to 2^15).
  const std::size_t first_chunk = GENERATE(std::size_t{1}, std::size_t{4}, row_store::chunk_rows);
  const std::size_t dim = 3, state = 2, floats = dim + state;
  row_store store(dim, state, first_chunk);
  std::unordered_map<std::uint64_t, std::uint64_t> ref;  // key → slot
  std::vector<std::uint64_t> order;                      // slot → key
  std::vector<std::vector<float>> values;                // slot → expected row
  std::vector<const float*> address;                     // slot → data(slot) at creation
  std::map<std::uint64_t, int> calls;
  const counting_fill fill{&calls};
  std::mt19937_64 rng(first_chunk);
  const auto random_key = [&] {
    switch (rng() % 3) {
      case 0:
        return rng() % 500;  // repeats
      case 1:
        return ~std::uint64_t{0} - rng() % 4;  // the top of the range
      default:
        return rng();  // anywhere
    }
  };
  const auto expect_created = [&](std::uint64_t key, std::uint64_t slot) {
    REQUIRE(slot == order.size());  // the next slot, in creation order
    ref.emplace(key, slot);
    order.push_back(key);
    std::vector<float> row(floats, 0.0f);
    for (std::size_t c = 0; c < dim; ++c)
      row[c] = static_cast<float>(key % 1000 + c) / 8.0f;
    values.push_back(row);
    address.push_back(store.data(slot));
  };
  for (int round = 0; round < 400; ++round) {
    switch (rng() % 3) {
      case 0: {  // find: never creates
        const std::uint64_t key = random_key();
        const auto it = ref.find(key);
        REQUIRE(store.find(key) == (it == ref.end() ? row_store::npos : it->second));
        break;
      }
      case 1: {  // find_or_create
        for (int k = 0; k < 20; ++k) {
          const std::uint64_t key = random_key();
          const auto it = ref.find(key);
          const auto [slot, created] = store.find_or_create(key, fill);
          REQUIRE(created == (it == ref.end()));
          if (created) {
            expect_created(key, slot);
          } else {
            REQUIRE(slot == it->second);
          }
        }
        break;
      }
      default: {  // resolve a batch (with repeats): new keys in order of first appearance
        std::vector<std::uint64_t> keys(rng() % 1200);
        for (auto& key : keys)
          key = rng() % 4 == 0 && !order.empty() ? order[rng() % order.size()] : random_key();
        std::vector<std::uint64_t> slots(keys.size());
        store.resolve(keys, slots, fill);
        for (std::size_t i = 0; i < keys.size(); ++i) {
          const auto it = ref.find(keys[i]);
          if (it == ref.end()) {
            expect_created(keys[i], slots[i]);
          } else {
            REQUIRE(slots[i] == it->second);
          }
        }
      }
    }
    // Write a few rows (weights and state) through their slots, as an optimizer does.
    for (int w = 0; w < 5 && !order.empty(); ++w) {
      const std::uint64_t slot = rng() % order.size();
      const auto c = static_cast<std::size_t>(rng() % floats);
      const float v = static_cast<float>(rng() % 1000) - 500.0f;
      store.data(slot)[c] = v;
      values[slot][c] = v;
    }
  }
  REQUIRE(store.size() == order.size());
  REQUIRE(order.size() > 10'000);
  REQUIRE(calls.size() == order.size());
  for (const auto& [key, n] : calls)
    REQUIRE(n == 1);  // one fill per row
  REQUIRE(std::equal(order.begin(), order.end(), store.keys().begin(), store.keys().end()));
  const row_store copy(store);
  for (std::uint64_t slot = 0; slot < order.size(); ++slot) {
    REQUIRE(store.find(order[slot]) == slot);
    REQUIRE(store.data(slot) == address[slot]);  // never moved
    REQUIRE(std::equal(values[slot].begin(), values[slot].end(), store.data(slot)));
    REQUIRE(copy.find(order[slot]) == slot);
    REQUIRE(copy.data(slot) != store.data(slot));
    REQUIRE(std::equal(values[slot].begin(), values[slot].end(), copy.data(slot)));
  }
}

TEST_CASE("row_store refuses bad shapes and a slot array of the wrong size",
          "[core][row_store][errors]") {
  auto e = catch_error([] { row_store(0, 4); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_THAT(e.what(), Catch::Contains("dim > 0"));
  for (const std::size_t first : {0u, 3u, 1000u, 2048u}) {
    e = catch_error([&] { row_store(4, 0, first); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK_THAT(e.what(), Catch::Contains("first_chunk_rows must be a power of two"));
  }
  e = catch_error([] { row_store(4, std::size_t{1} << 33); });
  CHECK(e.code() == errc::invalid_argument);
  CHECK_THAT(e.what(), Catch::Contains("exceed"));
  row_store store(4, 0);
  std::vector<std::uint64_t> slots(1);
  std::map<std::uint64_t, int> calls;
  e = catch_error([&] {
    store.resolve(std::vector<std::uint64_t>{1, 2}, slots, counting_fill{&calls});
  });
  CHECK(e.code() == errc::size_mismatch);
  CHECK(store.empty());
  CHECK(calls.empty());
}

TEST_CASE("row_store::max_bytes bounds bytes() as a store grows, bytes_per_row the large ones",
          "[core][row_store]") {
  // Chunks and index follow from the rows exactly; only the key array's spare capacity
  // (0 .. rows keys) is a bound. So bytes() lies in [max_bytes − 8 · rows, max_bytes].
  const std::size_t first_chunk = GENERATE(std::size_t{4}, row_store::chunk_rows);
  const std::size_t dim = 16, state = GENERATE(std::size_t{0}, std::size_t{16});
  row_store store(dim, state, first_chunk);
  std::map<std::uint64_t, int> calls;
  std::mt19937_64 rng(first_chunk + state);
  std::size_t checked = 0;
  double worst = 0;  // the largest bytes() / max_bytes seen: the bound is tight
  for (std::size_t rows = 1; rows <= 300'000; rows = rows < 64 ? rows + 1 : rows + rows / 7) {
    while (store.size() < rows)
      store.find_or_create(rng(), counting_fill{&calls});
    const std::uint64_t bound = row_store::max_bytes(rows, dim, state, first_chunk);
    INFO("rows " << rows << ", bytes " << store.bytes() << ", max_bytes " << bound);
    REQUIRE(store.bytes() <= bound);
    REQUIRE(store.bytes() >= bound - 8 * rows);
    worst = std::max(worst, static_cast<double>(store.bytes()) / static_cast<double>(bound));
    ++checked;
  }
  CHECK(checked > 100);
  CHECK(worst > 0.99);
  CHECK(row_store::max_bytes(0, dim, state, first_chunk) == 0);
  // Large stores: at most bytes_per_row a row (the last chunk's spare rows aside), which is
  // the payload + 16 B of key + 11.43 B of index; and not far below it.
  const double per_row = row_store::bytes_per_row(dim, state);
  CHECK(per_row == Approx(4.0 * static_cast<double>(dim + state) + 16 + 4 / 0.35));
  const double measured = static_cast<double>(store.bytes()) / static_cast<double>(store.size());
  CHECK(measured <=
        per_row + 4.0 * (dim + state) * row_store::chunk_rows / static_cast<double>(store.size()));
  CHECK(measured > 0.8 * per_row);
  for (const std::uint64_t rows : {std::uint64_t{1} << 20, (std::uint64_t{1} << 20) + 1,
                                   std::uint64_t{3'000'000}, std::uint64_t{700'001}})
    CHECK(static_cast<double>(row_store::max_bytes(rows, dim, state, first_chunk)) /
              static_cast<double>(rows) <=
          per_row + 4.0 * (dim + state) * row_store::chunk_rows / static_cast<double>(rows));
  // 10^6 SGD rows of dim 16 (bench_embedding's 80.8 B measured): bound 91.4 B.
  CHECK(row_store::bytes_per_row(16, 0) == Approx(91.43).epsilon(0.001));
}

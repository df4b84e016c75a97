/// @file row_store.hpp
/// `row_store`: 64-bit keys → rows of weights and optimizer state, created and initialised on
/// first touch, in chunks that never move — the one row store behind
/// `embedding::hash_table`'s tables and `ps::server`'s stripes.
#pragma once

#include <algorithm>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/row_init.hpp"

namespace strata {

/// Writes the initial weights of the row of `key` (a span of `dim` floats) — e.g.
/// `[&](std::uint64_t key, std::span<float> w) { init.fill(table, key, w); }`.
template <class F>
concept row_filler = std::invocable<F&, std::uint64_t, std::span<float>>;

/// One row of a `row_store`: its `dim` weights and, right after them, its optimizer state.
/// (`optim::row_ref` has the same two members: `{r.weights, r.state}` converts.)
template <class T>
struct basic_row {
  std::span<T> weights;
  std::span<T> state;
};
using row_span = basic_row<float>;
using const_row_span = basic_row<const float>;

/// Keys → rows, each row `dim` weights followed by `state_floats` optimizer state (one
/// contiguous run of `row_floats()` floats: an update touches one region per row). Keys are
/// any 64-bit values (collision-free: compared in full); rows are numbered densely
/// in creation order ("slots" 0, 1, 2, …) and live in chunks that are never moved or freed,
/// so a slot, a pointer or a span to a row stays valid while the store grows. Chunks hold
/// `chunk_rows` (1024) rows; with a smaller `first_chunk_rows` the first ones grow from that
/// size, doubling, up to 1024 (for many small stores, such as a parameter server's lock
/// stripes: each then holds a few rows' memory, and their rows do not all start at the same
/// page offset). A row is created on first touch: its weights by the caller's filler
/// (`uniform_init` values of (seed, table, key), or any `row_filler`), called exactly once per
/// row, and its state zero. (A filler that throws leaves its row created, weights zero.)
///
/// Index: open addressing with linear probing over a power-of-two array of 4-byte entries
/// (slot + 1; 0: empty), probed from a mixed hash of the key; an entry's key is read from the
/// slot → key array (`keys()`), so the index holds no key. The array doubles when 70% full
/// (35–70% occupied). At most 2^32 − 1 rows per store.
///
/// Memory: `bytes()` = the index (4 B per entry at 35–70% load: 5.7–11.4 B per row) + the keys
/// (8 B per row held, up to 16 while the vector has grown ahead) + the chunks (rows · row_floats ·
/// 4 bytes each, 64-byte aligned): at most chunk_rows − 1 rows more than held (growing first
/// chunks: below chunk_rows rows, at most twice the rows held). Cost: `find` one probe (a load of
/// the index, then of the key; the entries of a collision each cost a key load); a creation one
/// insertion (amortised O(1): growth rehashes every key), one new chunk now and then, one fill; row
/// access by slot two predicted branches, a shift, a mask and a load or two.
/// Thread-safety: const calls may run concurrently; a creating call (`find_or_create`, `resolve`)
/// needs exclusive access. Rows may be written concurrently through their slots (different rows),
/// as any array's elements.
class row_store {
 public:
  static constexpr std::uint64_t npos = ~std::uint64_t{0};
  /// Rows of a (full-size) chunk: 64 KiB for 16 floats per row. A constant, so that row
  /// access shifts and masks by constants.
  static constexpr std::size_t chunk_rows = 1024;

  /// An empty store of rows of `dim` weights and `state_floats` state, allocated in chunks of
  /// chunk_rows rows, the first ones growing from `first_chunk_rows` (chunk_rows: no growth).
  /// Throws `errc::invalid_argument` when dim == 0 or first_chunk_rows is not a power of two
  /// ≤ chunk_rows.
  row_store(std::size_t dim, std::size_t state_floats, std::size_t first_chunk_rows = chunk_rows)
      : dim_(static_cast<std::uint32_t>(dim)),
        row_floats_(static_cast<std::uint32_t>(dim + state_floats)),
        first_shift_(static_cast<std::uint16_t>(std::countr_zero(first_chunk_rows))) {
    STRATA_EXPECTS(dim > 0, "row_store: rows need dim > 0 weights");
    STRATA_EXPECTS(dim <= max_floats && state_floats <= max_floats - dim, "row_store: rows of ",
                   dim, " weights and ", state_floats, " state floats exceed ", max_floats,
                   " floats");
    STRATA_EXPECTS(std::has_single_bit(first_chunk_rows) && first_chunk_rows <= chunk_rows,
                   "row_store: first_chunk_rows must be a power of two ≤ ", chunk_rows, ", got ",
                   first_chunk_rows);
  }

  /// Copies are deep (their rows are their own); moves keep every row where it is.
  row_store(const row_store& other)
      : dim_(other.dim_),
        row_floats_(other.row_floats_),
        first_shift_(other.first_shift_),
        index_(other.index_),
        keys_(other.keys_),
        chunks_(other.chunks_) {
    if (!chunks_.empty()) head_ = chunks_.front().data();
  }
  row_store& operator=(const row_store& other) {
    if (this != &other) *this = row_store(other);
    return *this;
  }
  row_store(row_store&& other) noexcept = default;
  row_store& operator=(row_store&& other) noexcept = default;
  ~row_store() = default;

  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  [[nodiscard]] std::size_t state_floats() const noexcept { return row_floats_ - dim_; }
  /// dim + state_floats: the floats of one row.
  [[nodiscard]] std::size_t row_floats() const noexcept { return row_floats_; }
  [[nodiscard]] std::size_t first_chunk_rows() const noexcept {
    return std::size_t{1} << first_shift_;
  }
  /// Rows held (= the next slot).
  [[nodiscard]] std::size_t size() const noexcept { return keys_.size(); }
  [[nodiscard]] bool empty() const noexcept { return keys_.empty(); }
  /// keys()[slot] is the key of that row.
  [[nodiscard]] std::span<const std::uint64_t> keys() const noexcept { return keys_; }

  /// The slot of `key`, or npos when it has no row.
  [[nodiscard]] std::uint64_t find(std::uint64_t key) const noexcept {
    if (index_.empty()) return npos;
    const std::size_t mask = index_.size() - 1;
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      const std::uint32_t entry = index_[i];
      if (entry == 0) return npos;
      if (keys_[entry - 1] == key) return entry - 1;
    }
  }

  /// {slot of `key`, whether its row was created now}; a new row's weights are written by
  /// `fill(key, weights)` (its state is zero).
  template <row_filler Fill>
  std::pair<std::uint64_t, bool> find_or_create(std::uint64_t key, Fill&& fill) {
    // The lookup alone first: a present key (the common case) costs one probe and no call.
    if (const std::uint64_t slot = find(key); slot != npos) [[likely]]
      return {slot, false};
    const std::uint64_t slot = insert(key).first;
    fill(key, weights_of(slot));
    return {slot, true};
  }
  /// As above, with the values `init` gives row `key` of table `table`.
  std::pair<std::uint64_t, bool> find_or_create(std::uint64_t key, const uniform_init& init,
                                                std::size_t table) {
    return find_or_create(key, uniform_filler{&init, table});
  }

  /// slots[i] ← slot of keys[i] for every i, creating the rows of unseen keys in order of first
  /// appearance (so slots are the same as calling find_or_create key by key). Lookups run
  /// tbb-parallel above 4096 keys, fills above 1024 new rows (so `fill` must be safe to call
  /// for different keys at once); insertions are serial. Throws `errc::size_mismatch` unless
  /// slots.size() == keys.size() (nothing changed then).
  template <row_filler Fill>
  void resolve(std::span<const std::uint64_t> keys, std::span<std::uint64_t> slots, Fill&& fill) {
    const std::size_t n = keys.size();
    if (slots.size() != n)
      fail(errc::size_mismatch,
           cat("row_store::resolve: ", n, " keys but room for ", slots.size(), " slots"));
    const auto lookup = [&](std::size_t first, std::size_t last) {
      for (std::size_t i = first; i < last; ++i)
        slots[i] = find(keys[i]);
    };
    if (n < parallel_lookups) {
      lookup(0, n);
    } else {
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, n, 1024),
          [&](const tbb::blocked_range<std::size_t>& r) { lookup(r.begin(), r.end()); });
    }
    const std::uint64_t before = size();  // the new rows: slots [before, size())
    // A plain scan up to the first unseen key (usually none): the insertion loop, with insert()
    // inlined, is heavier per key (measured: +5% on bench_embedding's hash_table forward).
    for (auto i =
             static_cast<std::size_t>(std::find(slots.begin(), slots.end(), npos) - slots.begin());
         i < n; ++i)
      if (slots[i] == npos) slots[i] = insert(keys[i]).first;
    const auto init = [&](std::uint64_t first, std::uint64_t last) {
      for (std::uint64_t slot = first; slot < last; ++slot)
        fill(keys_[slot], weights_of(slot));
    };
    if (size() - before < parallel_fills) {
      init(before, size());
    } else {
      tbb::parallel_for(
          tbb::blocked_range<std::uint64_t>(before, size(), 256),
          [&](const tbb::blocked_range<std::uint64_t>& r) { init(r.begin(), r.end()); });
    }
  }
  /// As above, with the values `init` gives rows of table `table`.
  void resolve(std::span<const std::uint64_t> keys, std::span<std::uint64_t> slots,
               const uniform_init& init, std::size_t table) {
    resolve(keys, slots, uniform_filler{&init, table});
  }

  /// The row_floats() floats of row `slot` (< size(), unchecked): weights, then state.
  [[nodiscard]] float* data(std::uint64_t slot) noexcept { return row_data(*this, slot); }
  [[nodiscard]] const float* data(std::uint64_t slot) const noexcept {
    return row_data(*this, slot);
  }
  /// Weights and state of row `slot` (< size(), unchecked).
  [[nodiscard]] row_span row(std::uint64_t slot) noexcept {
    float* p = data(slot);
    return {{p, dim_}, {p + dim_, state_floats()}};
  }
  [[nodiscard]] const_row_span row(std::uint64_t slot) const noexcept {
    const float* p = data(slot);
    return {{p, dim_}, {p + dim_, state_floats()}};
  }

  /// Calls `fn(key, weights, state)` (spans of const float) for every row, in slot order.
  template <class Fn>
  void for_each(Fn&& fn) const {
    for (std::uint64_t slot = 0; slot < keys_.size(); ++slot) {
      const auto r = row(slot);
      fn(keys_[slot], r.weights, r.state);
    }
  }

  /// The most bytes() a store of rows of `dim` weights and `state_floats` state holds once it
  /// has `rows` rows: its chunks and its index exactly (both follow from `rows` and
  /// `first_chunk_rows`), the slot → key array at its largest (a vector that doubles holds
  /// < 2 · rows keys). Chunks: below chunk_rows rows, max(first_chunk_rows, bit_ceil(rows))
  /// rows (the first chunks double); from chunk_rows on, rows rounded up to whole chunks.
  /// Index: the least power of two ≥ 16 entries that is ≥ rows / 0.7. What a table-holding
  /// process will need, known before it allocates anything (ctr_train's start-up check).
  /// O(log rows).
  [[nodiscard]] static constexpr std::uint64_t max_bytes(
      std::uint64_t rows, std::size_t dim, std::size_t state_floats,
      std::size_t first_chunk_rows = chunk_rows) {
    if (rows == 0) return 0;
    std::uint64_t entries = first_index_entries;  // insert(): doubles while (rows) * 10 > 7 E
    while (rows * 10 > entries * 7)
      entries *= 2;
    const std::uint64_t allocated =
        rows < chunk_rows ? std::max<std::uint64_t>(first_chunk_rows, std::bit_ceil(rows))
                          : (rows + chunk_rows - 1) / chunk_rows * chunk_rows;
    return allocated * (dim + state_floats) * sizeof(float) + entries * sizeof(std::uint32_t) +
           2 * rows * sizeof(std::uint64_t);
  }
  /// Bytes per row of a large store, at most: its weights and state (4 · (dim + state_floats))
  /// plus its key (8 B, < 16 B with a vector's spare capacity) plus its index entry (4 B at a
  /// load of 35–70%: < 11.43 B). max_bytes(rows) / rows tends to at most this as rows grows
  /// (the chunks' rows beyond those held are < chunk_rows). At dim 16: 91.4 B with SGD
  /// (measured 80.8 for 10^6 keys, payload 64), 155.4 with Adagrad (state: dim floats).
  [[nodiscard]] static constexpr double bytes_per_row(std::size_t dim,
                                                      std::size_t state_floats) noexcept {
    return static_cast<double>((dim + state_floats) * sizeof(float)) + 2.0 * sizeof(std::uint64_t) +
           sizeof(std::uint32_t) / 0.35;
  }

  /// Bytes held: the index, the slot → key array (capacities) and every allocated chunk.
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t total =
        index_.capacity() * sizeof(std::uint32_t) + keys_.capacity() * sizeof(std::uint64_t);
    for (const auto& chunk : chunks_)
      total += chunk.size() * sizeof(float);
    return total;
  }

 private:
  /// Lookups of a `resolve` below this many keys stay on the calling thread.
  static constexpr std::size_t parallel_lookups = 4096;
  /// Fills of a `resolve` below this many new rows stay on the calling thread.
  static constexpr std::size_t parallel_fills = 1024;
  /// Largest dim and state_floats (stored in 32 bits: a store's header stays small).
  static constexpr std::size_t max_floats = std::uint32_t(-1);
  /// Most rows of a store: an index entry is slot + 1 in 32 bits.
  static constexpr std::uint64_t max_rows = std::uint32_t(-1);
  /// Index entries of a store's first index (it doubles when 70% full).
  static constexpr std::size_t first_index_entries = 16;
  /// log2(chunk_rows).
  static constexpr unsigned chunk_shift = 10;
  static_assert(chunk_rows == std::size_t{1} << chunk_shift);

  /// The filler of table `table` of `init`.
  struct uniform_filler {
    const uniform_init* init;
    std::size_t table;
    void operator()(std::uint64_t key, std::span<float> weights) const noexcept {
      init->fill(table, key, weights);
    }
  };

  /// data(slot) for a const or mutable store:
  /// - chunks all of chunk_rows rows (as embedding::hash_table's): a shift and a mask by
  ///   constants. This branch goes the same way for every slot of a store, so it is predicted;
  ///   a branch on the slot would not be (a Zipf-keyed table's hot keys, created first, have the
  ///   low slots: a version that branched on slot < chunk_rows made bench_embedding's hash_table
  ///   pooled forward 2.7× slower);
  /// - growing first chunks (as ps::server's stripes): the first chunk through `head_`, without
  ///   the chunk table (a separate allocation, so one more dependent load: through it, bench_ps's
  ///   message pulls were ~8% slower, a stripe holding a few rows); later ones through
  ///   `locate`, without branches.
  template <class Self>
  static auto row_data(Self& self, std::uint64_t slot) noexcept
      -> decltype(self.chunks_.front().data()) {
    const std::size_t floats = self.row_floats_;
    if (self.first_shift_ == chunk_shift) [[likely]]
      return self.chunks_[slot >> chunk_shift].data() + (slot & (chunk_rows - 1)) * floats;
    if ((slot >> self.first_shift_) == 0) return self.head_ + slot * floats;
    const auto [chunk, offset] = self.locate(slot);
    return self.chunks_[chunk].data() + offset * floats;
  }
  /// {chunk, row within it} of `slot` when the first chunks grow. Chunk 0 has 2^f rows (f =
  /// first_shift_), chunk c ≥ 1 of the growing ones holds slots [2^(f+c−1), 2^(f+c)); from slot
  /// 2^k (k = chunk_shift) on, chunks hold 2^k rows. So with e = clamp(bit_width(slot) − 1, f, k)
  /// (log2 of the size of the slot's chunk): chunk = (slot >> e) + e − f, row = slot mod 2^e.
  [[nodiscard]] std::pair<std::size_t, std::uint64_t> locate(std::uint64_t slot) const noexcept {
    const int top = static_cast<int>(std::bit_width(slot | 1)) - 1;  // | 1: no test for 0
    const auto e = static_cast<unsigned>(std::clamp<int>(top, first_shift_, chunk_shift));
    return {static_cast<std::size_t>((slot >> e) + e - first_shift_),
            slot & ((std::uint64_t{1} << e) - 1)};
  }

  /// {slot, created}: a new key gets the next slot (weights and state zero), in a new chunk
  /// when the last one is full. Everything that can fail (chunk, index growth, the key array)
  /// comes before the key is indexed: a failed allocation leaves the keys as they were.
  std::pair<std::uint64_t, bool> insert(std::uint64_t key) {
    std::size_t i = 0;
    if (!index_.empty()) {
      i = probe(key);
      if (index_[i] != 0) return {index_[i] - 1, false};
    }
    const std::uint64_t slot = keys_.size();
    if (slot == max_rows) [[unlikely]]
      fail(errc::out_of_range,
           cat("row_store: full: ", max_rows, " rows is the most one store holds"));
    if (slot == capacity()) [[unlikely]] {
      const std::size_t c = chunks_.size();
      const std::size_t rows = c == 0 ? std::size_t{1} << first_shift_
                               : c <= std::size_t{chunk_shift} - first_shift_
                                   ? std::size_t{1} << (first_shift_ + c - 1)
                                   : chunk_rows;
      chunks_.emplace_back(rows * row_floats());
      head_ = chunks_.front().data();
    }
    if ((slot + 1) * 10 > index_.size() * 7) [[unlikely]] {
      rehash(index_.empty() ? first_index_entries : index_.size() * 2);
      i = probe(key);
    }
    keys_.push_back(key);
    index_[i] = static_cast<std::uint32_t>(slot + 1);
    return {slot, true};
  }
  /// The index position of `key`, or of the empty entry where it would go (index not empty).
  [[nodiscard]] std::size_t probe(std::uint64_t key) const noexcept {
    const std::size_t mask = index_.size() - 1;
    std::size_t i = hash(key) & mask;
    while (index_[i] != 0 && keys_[index_[i] - 1] != key)
      i = (i + 1) & mask;
    return i;
  }
  /// A new index of `entries` (a power of two) entries holding every key.
  void rehash(std::size_t entries) {
    std::vector<std::uint32_t> next(entries, 0);
    const std::size_t mask = entries - 1;
    for (std::uint64_t slot = 0; slot < keys_.size(); ++slot) {
      std::size_t i = hash(keys_[slot]) & mask;
      while (next[i] != 0)
        i = (i + 1) & mask;
      next[i] = static_cast<std::uint32_t>(slot + 1);
    }
    index_ = std::move(next);
  }
  static std::uint64_t hash(std::uint64_t key) noexcept { return mix_ids(key, 0x5bd1e995u); }
  /// Rows the chunks hold: 2^(first_shift_ + c − 1) for c ≤ the growing chunks, then
  /// chunk_rows more per chunk.
  [[nodiscard]] std::size_t capacity() const noexcept {
    const std::size_t c = chunks_.size(), growing = std::size_t{chunk_shift} - first_shift_ + 1;
    if (c == 0) return 0;
    if (c <= growing) return std::size_t{1} << (first_shift_ + c - 1);
    return (c - growing + 1) << chunk_shift;
  }
  std::span<float> weights_of(std::uint64_t slot) noexcept { return {data(slot), dim_}; }

  // Small (96 bytes) on purpose: a parameter-server table has `stripes` stores, whose headers
  // a request may all touch (stripes 80 bytes larger made bench_ps's message steps ~8% slower).
  float* head_ = nullptr;  // chunks_.front()'s rows
  std::uint32_t dim_, row_floats_;
  // Not (unsigned) char: a char may alias the rows, so each row write would reload them.
  std::uint16_t first_shift_;                  // log2(first_chunk_rows)
  std::vector<std::uint32_t> index_;           // slot + 1 of the keys (0: empty), see find()
  std::vector<std::uint64_t> keys_;            // slot → key
  std::vector<aligned_buffer<float>> chunks_;  // see locate()
};

}  // namespace strata

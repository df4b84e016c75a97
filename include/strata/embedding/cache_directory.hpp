/// @file cache_directory.hpp
/// `cache_directory`: the host-side policy of a cache of embedding rows — which key sits in
/// which of a fixed number of slots, which keys a batch must fetch from the backing storage,
/// and which slot gives way (least recently used) when the cache is full. It holds no row
/// values: the rows live wherever the caller keeps the slots (device memory for
/// strata::cuda::row_cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/key_index.hpp"
#include "strata/core/rng.hpp"

namespace strata::embedding {

/// Cumulative counters of a cache_directory (since construction or `reset_stats`).
struct cache_stats {
  std::uint64_t lookups = 0;        ///< keys planned, duplicates included
  std::uint64_t hits = 0;           ///< distinct keys of a plan served from the cache
  std::uint64_t misses = 0;         ///< distinct keys of a plan fetched (absent or too old)
  std::uint64_t evictions = 0;      ///< cached keys dropped to make room for a miss
  std::uint64_t invalidations = 0;  ///< cached keys forgotten by `invalidate` or `clear`
};

/// What one batch needs, as views into the directory's reusable buffers (valid until the next
/// `plan`; `invalidate` and `clear` leave them intact).
struct cache_plan {
  /// slots[i] is the slot that holds (or, once fetched, will hold) the row of keys[i].
  std::span<const std::uint32_t> slots;
  /// Distinct keys whose rows must be fetched from the backing storage, each once: first the
  /// cached but too old ones, then the absent ones, each group in order of first occurrence.
  std::span<const std::uint64_t> fetch_keys;
  /// fetch_slots[j] is the slot that must receive the row of fetch_keys[j] (all distinct).
  std::span<const std::uint32_t> fetch_slots;
};

namespace detail {

/// A fixed-size map key → slot for at most `capacity` keys: open addressing on the full 64-bit
/// key, linear probing from a mixed hash, load ≤ 50% (the table never grows), and
/// backward-shift deletion (no tombstones, so probe lengths do not degrade under churn).
/// Cost: O(1) expected per find / insert / erase. Memory: 16 B × a power of two ≥ 2·capacity.
class slot_map {
 public:
  static constexpr std::uint32_t npos = std::numeric_limits<std::uint32_t>::max();

  explicit slot_map(std::size_t capacity) {
    std::size_t size = 16;
    while (size < 2 * capacity)
      size *= 2;
    entries_.assign(size, entry{});
    mask_ = size - 1;
  }

  /// The slot of `key`, or npos.
  [[nodiscard]] std::uint32_t find(std::uint64_t key) const noexcept {
    for (std::size_t i = home(key);; i = (i + 1) & mask_) {
      const entry& e = entries_[i];
      if (e.slot == npos) return npos;
      if (e.key == key) return e.slot;
    }
  }

  /// Adds key → slot. Precondition: `key` is absent and fewer than `capacity` keys are held.
  void insert(std::uint64_t key, std::uint32_t slot) noexcept {
    std::size_t i = home(key);
    while (entries_[i].slot != npos)
      i = (i + 1) & mask_;
    entries_[i] = {key, slot};
  }

  /// Removes `key`; returns whether it was present.
  bool erase(std::uint64_t key) noexcept {
    std::size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (entries_[i].slot == npos) return false;
      if (entries_[i].key == key) break;
    }
    // Backward shift: pull later entries of the probe run into the hole unless their home lies
    // cyclically in (hole, j] (then moving them before their home would hide them).
    for (std::size_t j = (i + 1) & mask_; entries_[j].slot != npos; j = (j + 1) & mask_) {
      const std::size_t h = home(entries_[j].key);
      const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
      if (!stays) {
        entries_[i] = entries_[j];
        i = j;
      }
    }
    entries_[i] = entry{};
    return true;
  }

  void clear() noexcept {
    for (auto& e : entries_)
      e = entry{};
  }

  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return entries_.capacity() * sizeof(entry);
  }

 private:
  struct entry {
    std::uint64_t key = 0;
    std::uint32_t slot = npos;  // npos: empty
  };
  [[nodiscard]] std::size_t home(std::uint64_t key) const noexcept {
    return static_cast<std::size_t>(mix_ids(key, 0x243F6A8885A308D3ull)) & mask_;
  }

  std::vector<entry> entries_;
  std::size_t mask_ = 0;
};

}  // namespace detail

/// Which embedding rows a fixed-size cache holds, and what a batch must fetch.
///
/// A directory has `capacity` slots 0 … capacity−1. `plan(keys, step)` gives every key its
/// slot and lists the distinct keys to fetch from the backing storage (with their slots):
/// - **Hit**: the key is cached and `fetched ≤ step ≤ fetched + max_staleness`, where
///   `fetched` is the step its row was last fetched. The row is reused, nothing is fetched.
/// - **Stale**: cached but older (or `step < fetched`: steps went backwards) — refetched into
///   its own slot. With `max_staleness = 0` a row is reused only within the step that fetched
///   it: across steps the cache is an exact pass-through (each step sees the storage's current
///   rows). With `max_staleness = S` a row may be up to S steps old; that is legal exactly when
///   the training's consistency allows reading rows S steps stale — `ps::bounded<S>` (a pull
///   for step t may already miss the updates of steps after t − S), or any S under `ps::async`.
///   Under `ps::sync` only S = 0 keeps training equal to the uncached one.
/// - **Absent**: takes the least recently used slot that this batch does not use. Free slots
///   (never used, invalidated or cleared) come first; otherwise the cached key of that slot is
///   evicted. A batch never evicts its own rows.
///
/// Recency (deterministic: the same calls give the same slots): a plan marks the slots it uses
/// most recently used — first its cached keys in order of first occurrence, then its absent
/// keys in order of first occurrence. Invalidated slots become the least recently used (the
/// last one invalidated is reused first). Initially slots are taken in order 0, 1, 2, ….
///
/// Cost: `plan` is O(keys) expected (one hash probe per key, O(1) list work per distinct key);
/// `invalidate` O(keys); `clear` O(capacity). After the buffers have grown to the largest batch
/// (warm-up), no call allocates. Memory ≈ 33 B per slot + a 16 B × (2–4)·capacity index + the
/// per-batch buffers (`memory_bytes`).
/// Errors: a batch with more distinct keys than `capacity` raises errc::invalid_argument and
/// leaves the directory as it was.
/// Thread-safety: none; one caller at a time (row_cache keeps one directory per table).
///
/// ```cpp
/// cache_directory dir(/*capacity_rows=*/100'000, /*max_staleness_steps=*/2);
/// const cache_plan p = dir.plan(batch_keys, step);
/// storage.gather(table, p.fetch_keys, staging);   // rows to copy into slots p.fetch_slots
/// // out[i] = slot p.slots[i]
/// ```
class cache_directory {
 public:
  /// Marks "no slot" (`find` of an absent key).
  static constexpr std::uint32_t no_slot = detail::slot_map::npos;

  /// An empty directory of `capacity_rows` slots (1 ≤ capacity_rows < 2^32 − 1). `name` starts
  /// its error messages (e.g. "cuda::row_cache table 2 'items'").
  cache_directory(std::size_t capacity_rows, std::uint64_t max_staleness_steps,
                  std::string name = "cache_directory")
      : capacity_((check_capacity(capacity_rows, name), capacity_rows)),
        max_staleness_(max_staleness_steps),
        name_(std::move(name)),
        map_(capacity_rows),
        key_(capacity_rows, 0),
        fetched_(capacity_rows, 0),
        mark_(capacity_rows, 0),
        occupied_(capacity_rows, 0),
        prev_(capacity_rows + 1),
        next_(capacity_rows + 1) {
    present_.reserve(capacity_);
    fetch_keys_.reserve(capacity_);
    fetch_slots_.reserve(capacity_);
    reset_order();
  }

  [[nodiscard]] std::size_t capacity() const noexcept { return capacity_; }
  [[nodiscard]] std::uint64_t max_staleness() const noexcept { return max_staleness_; }
  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// Number of keys cached now.
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  /// Slots and fetch list for `keys` at training step `step` (see the class comment). The
  /// returned views stay valid until the next `plan`. The caller must copy the fetched rows
  /// into their slots before reading `slots`: the directory already counts them as cached.
  /// Throws errc::invalid_argument, changing nothing, when the batch has more distinct keys than
  /// `capacity()`.
  cache_plan plan(std::span<const std::uint64_t> keys, std::uint64_t step) {
    const std::size_t n = keys.size();
    // Pass 1 (changes nothing observable): find cached keys, de-duplicate absent ones.
    ++epoch_;
    misses_.clear();
    present_.clear();
    slots_.resize(n);
    pending_.resize(n);
    bool overflow = false;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t key = keys[i];
      const std::uint32_t s = map_.find(key);
      if (s != no_slot) {
        slots_[i] = s;
        pending_[i] = no_slot;
        if (mark_[s] != epoch_) {
          mark_[s] = epoch_;
          if (!overflow) present_.push_back(s);
        }
      } else {
        // ids < capacity unless the batch overflows (then it throws below)
        pending_[i] = static_cast<std::uint32_t>(misses_.find_or_insert(key).first);
      }
      if (!overflow && present_.size() + misses_.size() > capacity_) overflow = true;
    }
    if (overflow) {
      std::size_t present = 0;  // failure path: count the cached distinct keys exactly
      for (std::size_t s = 0; s < capacity_; ++s)
        present += mark_[s] == epoch_ ? 1 : 0;
      fail(errc::invalid_argument,
           cat(name_, ": a batch of ", n, " keys has ", present + misses_.size(),
               " distinct keys but the cache holds only ", capacity_,
               " rows, and a batch never evicts its own rows; raise the cache capacity (rows per "
               "table) to at least the largest batch's distinct-key count, or split the batch"));
    }

    // Pass 2 (no allocation, cannot throw): cached keys first, then absent keys.
    fetch_keys_.clear();
    fetch_slots_.clear();
    for (const std::uint32_t s : present_) {
      move_to_back(s);
      if (fresh(s, step)) {
        ++stats_.hits;
      } else {
        fetched_[s] = step;
        fetch_keys_.push_back(key_[s]);
        fetch_slots_.push_back(s);
      }
    }
    const std::size_t first_absent = fetch_slots_.size();
    for (const std::uint64_t key : misses_.keys()) {
      const std::uint32_t s = next_[capacity_];  // least recently used; never this batch's
      if (occupied_[s] != 0) {
        map_.erase(key_[s]);
        ++stats_.evictions;
      } else {
        occupied_[s] = 1;
        ++size_;
      }
      key_[s] = key;
      fetched_[s] = step;
      map_.insert(key, s);
      move_to_back(s);
      fetch_keys_.push_back(key);
      fetch_slots_.push_back(s);
    }
    for (std::size_t i = 0; i < n; ++i)
      if (pending_[i] != no_slot) slots_[i] = fetch_slots_[first_absent + pending_[i]];
    stats_.lookups += n;
    stats_.misses += fetch_keys_.size();
    return {slots_, fetch_keys_, fetch_slots_};
  }

  /// Forgets `keys` (absent ones are ignored): the next plan refetches them. Their slots become
  /// the least recently used. Returns how many were cached. O(keys.size()). `keys` may view
  /// the last plan's buffers (they are not changed).
  std::size_t invalidate(std::span<const std::uint64_t> keys) noexcept {
    std::size_t forgotten = 0;
    for (const std::uint64_t key : keys) {
      const std::uint32_t s = map_.find(key);
      if (s == no_slot) continue;
      map_.erase(key);
      occupied_[s] = 0;
      --size_;
      unlink(s);
      link_after(capacity_, s);  // front: reused first
      ++forgotten;
    }
    stats_.invalidations += forgotten;
    return forgotten;
  }

  /// Forgets every key: back to the freshly constructed state (statistics are kept, the
  /// forgotten keys counted as invalidations). O(capacity).
  void clear() noexcept {
    stats_.invalidations += size_;
    map_.clear();
    for (std::size_t s = 0; s < capacity_; ++s)
      occupied_[s] = 0;
    size_ = 0;
    reset_order();
  }

  /// The slot holding `key`, or no_slot (whatever the row's age).
  [[nodiscard]] std::uint32_t find(std::uint64_t key) const noexcept { return map_.find(key); }
  /// Whether slot `s` (< capacity) holds a key.
  [[nodiscard]] bool occupied(std::uint32_t s) const noexcept { return occupied_[s] != 0; }
  /// The key in slot `s` (meaningful when occupied).
  [[nodiscard]] std::uint64_t key_at(std::uint32_t s) const noexcept { return key_[s]; }
  /// The step at which the row in slot `s` was fetched (meaningful when occupied).
  [[nodiscard]] std::uint64_t fetched_step(std::uint32_t s) const noexcept { return fetched_[s]; }

  [[nodiscard]] const cache_stats& stats() const noexcept { return stats_; }
  void reset_stats() noexcept { stats_ = {}; }

  /// Bytes held by the directory (slot arrays, index, per-batch buffers).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return map_.memory_bytes() + misses_.memory_bytes() +
           (key_.capacity() + fetched_.capacity() + mark_.capacity() + fetch_keys_.capacity()) *
               sizeof(std::uint64_t) +
           (prev_.capacity() + next_.capacity() + present_.capacity() + slots_.capacity() +
            pending_.capacity() + fetch_slots_.capacity()) *
               sizeof(std::uint32_t) +
           occupied_.capacity();
  }

 private:
  static void check_capacity(std::size_t capacity, const std::string& name) {
    if (capacity == 0 || capacity >= no_slot)
      fail(errc::invalid_argument,
           cat(name, ": capacity_rows is ", capacity, "; a row cache needs 1 to ", no_slot - 1,
               " rows (at least the largest batch's distinct-key count)"));
  }

  [[nodiscard]] bool fresh(std::uint32_t s, std::uint64_t step) const noexcept {
    return step >= fetched_[s] && step - fetched_[s] <= max_staleness_;
  }

  // Recency list over slots: a circular doubly linked list through prev_/next_ with the
  // sentinel node `capacity_`; next_[capacity_] is the least recently used slot.
  void unlink(std::uint32_t s) noexcept {
    next_[prev_[s]] = next_[s];
    prev_[next_[s]] = prev_[s];
  }
  void link_after(std::size_t at, std::uint32_t s) noexcept {
    const auto a = static_cast<std::uint32_t>(at);
    prev_[s] = a;
    next_[s] = next_[a];
    prev_[next_[a]] = s;
    next_[a] = s;
  }
  void move_to_back(std::uint32_t s) noexcept {
    unlink(s);
    link_after(prev_[capacity_], s);
  }
  void reset_order() noexcept {
    const std::size_t n = capacity_ + 1;  // slots 0 … capacity−1 in order, then the sentinel
    for (std::size_t i = 0; i < n; ++i) {
      next_[i] = static_cast<std::uint32_t>((i + 1) % n);
      prev_[i] = static_cast<std::uint32_t>((i + n - 1) % n);
    }
  }

  std::size_t capacity_;
  std::uint64_t max_staleness_;
  std::string name_;
  detail::slot_map map_;
  // Per slot: key, fetch step, last plan that used it, whether it holds a key.
  std::vector<std::uint64_t> key_, fetched_, mark_;
  std::vector<std::uint8_t> occupied_;
  std::vector<std::uint32_t> prev_, next_;  // capacity + 1 entries (sentinel last)
  std::size_t size_ = 0;
  std::uint64_t epoch_ = 0;
  cache_stats stats_;
  // Per-plan buffers, reused.
  key_index misses_;                    // absent keys of the batch, first-occurrence order
  std::vector<std::uint32_t> present_;  // cached slots of the batch, first-occurrence order
  std::vector<std::uint32_t> pending_;  // per key: id in misses_, or no_slot
  std::vector<std::uint32_t> slots_, fetch_slots_;
  std::vector<std::uint64_t> fetch_keys_;
};

}  // namespace strata::embedding

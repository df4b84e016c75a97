/// @file key_index.hpp
/// `key_index`: a flat open-addressing map from 64-bit keys to dense row numbers 0, 1, 2, …
/// in order of first insertion — the index behind hash_table embeddings, parameter-server
/// shards and key de-duplication.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "strata/core/rng.hpp"

namespace strata {

/// Keys → rows, collision-free on the full 64-bit key (any key value is valid). Slots
/// {key, row} (16 bytes) in a power-of-two array probed linearly from a mixed hash; the array
/// doubles when 70% full, so it is 35–70% occupied. Rows are numbered densely in insertion
/// order and never change; `keys()` maps a row back to its key.
///
/// Cost: one probe (usually one cache line) per lookup; growth rehashes every key (amortised
/// O(1) per insertion). Memory: 16 B / load per slot + 8 B per key (`memory_bytes`).
/// Thread-safety: concurrent `find` calls are safe; an insertion or `clear` needs exclusive
/// access.
class key_index {
 public:
  static constexpr std::uint64_t npos = ~std::uint64_t{0};

  /// An empty index with room for about `expected` keys before it grows.
  explicit key_index(std::size_t expected = 0) { reserve(expected); }

  /// Number of keys (= rows).
  [[nodiscard]] std::size_t size() const noexcept { return keys_.size(); }
  [[nodiscard]] bool empty() const noexcept { return keys_.empty(); }
  /// keys()[row] is the key of `row`.
  [[nodiscard]] std::span<const std::uint64_t> keys() const noexcept { return keys_; }

  /// The row of `key`, or npos when absent.
  [[nodiscard]] std::uint64_t find(std::uint64_t key) const noexcept {
    if (slots_.empty()) return npos;
    const std::size_t mask = slots_.size() - 1;
    for (std::size_t i = hash(key) & mask;; i = (i + 1) & mask) {
      const slot& s = slots_[i];
      if (s.row == npos) return npos;
      if (s.key == key) return s.row;
    }
  }

  /// {row of `key`, whether it was inserted now (as row size() − 1)}.
  std::pair<std::uint64_t, bool> find_or_insert(std::uint64_t key) {
    if (slots_.empty()) reserve(8);
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = hash(key) & mask;
    for (;; i = (i + 1) & mask) {
      const slot& s = slots_[i];
      if (s.row == npos) break;
      if (s.key == key) return {s.row, false};
    }
    const std::uint64_t row = keys_.size();
    keys_.push_back(key);
    if (keys_.size() * 10 > slots_.size() * 7) {
      rehash(slots_.size() * 2);  // places `key` too
    } else {
      slots_[i] = {key, row};
    }
    return {row, true};
  }

  /// Makes room for `n` keys without growing.
  void reserve(std::size_t n) {
    std::size_t capacity = 16;
    while (capacity * 7 < n * 10)
      capacity *= 2;
    if (capacity > slots_.size()) rehash(capacity);
    keys_.reserve(n);
  }

  /// Removes every key; keeps the allocated slots. O(min(size, capacity)): a sparse index
  /// empties the slots of its keys only, newest first — every key was placed (by insertion or
  /// by a rehash in row order) after the keys it probed past, so those are still in place
  /// when it is looked up.
  void clear() noexcept {
    if (keys_.size() * 4 < slots_.size()) {
      const std::size_t mask = slots_.size() - 1;
      for (auto key = keys_.rbegin(); key != keys_.rend(); ++key) {
        std::size_t i = hash(*key) & mask;
        while (slots_[i].key != *key || slots_[i].row == npos)
          i = (i + 1) & mask;
        slots_[i] = slot{};
      }
    } else {
      for (auto& s : slots_)
        s = slot{};
    }
    keys_.clear();
  }

  /// Bytes held (slots and the row → key array).
  [[nodiscard]] std::size_t memory_bytes() const noexcept {
    return slots_.capacity() * sizeof(slot) + keys_.capacity() * sizeof(std::uint64_t);
  }

 private:
  struct slot {
    std::uint64_t key = 0;
    std::uint64_t row = npos;  // npos: empty
  };

  static std::uint64_t hash(std::uint64_t key) noexcept { return mix_ids(key, 0x5bd1e995u); }

  void rehash(std::size_t capacity) {
    slots_.assign(capacity, slot{});
    const std::size_t mask = capacity - 1;
    for (std::uint64_t r = 0; r < keys_.size(); ++r) {
      std::size_t i = hash(keys_[r]) & mask;
      while (slots_[i].row != npos)
        i = (i + 1) & mask;
      slots_[i] = {keys_[r], r};
    }
  }

  std::vector<slot> slots_;
  std::vector<std::uint64_t> keys_;
};

}  // namespace strata

/// @file sparse_gradient.hpp
/// Sparse gradients of embedding rows: grouping the occurrences of each key (`key_groups`),
/// summing the rows of duplicate keys in a deterministic order (`sparse_gradient`,
/// `sum_duplicates`), applying a sparse optimizer to unique rows (`apply_sparse`), and the
/// fused form that sums each key's rows straight into a small accumulator and updates its row
/// at once, without a summed-gradient buffer (`apply_grouped`).
///
/// Every path sums the rows of one key in their original order (first occurrence copied, the
/// others added one by one) and applies the optimizer once per key, so all of them give
/// bitwise identical rows, whatever the thread count.
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/optim/concepts.hpp"

namespace strata::optim {

/// One embedding row and its optimizer state, as handed to an optimizer's `apply`.
struct row_ref {
  std::span<float> weights;
  std::span<float> state;
};

namespace detail {
/// Below this many floats of work a loop stays on the calling thread.
inline constexpr std::size_t parallel_floats = std::size_t{1} << 15;
/// Below this many floats of work `apply_grouped` stays on the calling thread; above it each
/// task gets at least this much (a tbb dispatch costs a few microseconds, a float of grouped
/// work about a nanosecond).
inline constexpr std::size_t grouped_parallel_floats = std::size_t{1} << 18;
/// Groups looked ahead by `apply_grouped`'s software prefetch of table rows.
inline constexpr std::size_t prefetch_groups = 8;

/// Threads a parallel loop started here can use: this arena's concurrency, capped by a
/// tbb::global_control limit on parallelism.
inline std::size_t usable_threads() noexcept {
  return std::min(static_cast<std::size_t>(tbb::this_task_arena::max_concurrency()),
                  tbb::global_control::active_value(tbb::global_control::max_allowed_parallelism));
}

/// Prefetches the cache lines of `count` floats for writing. The empty `asm volatile` keeps
/// the prefetch: GCC deems a function (or lambda) whose only effect is __builtin_prefetch
/// `const` and deletes calls to it that it did not inline early.
inline void prefetch_for_write(const float* p, std::size_t count) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  for (std::size_t c = 0; c < count; c += 16)
    __builtin_prefetch(p + c, 1, 3);
  asm volatile("" : : "r"(p));
#else
  (void)p;
  (void)count;
#endif
}

/// Calls `fn.template operator()<D>()` with D = dim for the common row widths (so loops over
/// a row have a compile-time trip count and stay in registers) and D = 0 otherwise.
template <class Fn>
decltype(auto) with_dim(std::size_t dim, Fn&& fn) {
  switch (dim) {
    case 8:
      return fn.template operator()<8>();
    case 16:
      return fn.template operator()<16>();
    case 32:
      return fn.template operator()<32>();
    case 64:
      return fn.template operator()<64>();
    case 128:
      return fn.template operator()<128>();
    default:
      return fn.template operator()<0>();
  }
}

/// sum ← row_of(members[0]) + row_of(members[1]) + … in that order (first copied, the others
/// added one by one). `Dim` > 0 fixes the width at compile time; 0 uses `dim`.
template <std::size_t Dim, class RowOf>
inline void sum_rows(std::span<const std::uint32_t> members, const RowOf& row_of, std::size_t dim,
                     float* sum) {
  const std::size_t d = Dim > 0 ? Dim : dim;
  const float* lead = row_of(members[0]);
  std::copy(lead, lead + d, sum);
  for (std::size_t j = 1; j < members.size(); ++j) {
    const float* in = row_of(members[j]);
    for (std::size_t c = 0; c < d; ++c)
      sum[c] += in[c];
  }
}
}  // namespace detail

/// Order of the groups of a `key_groups`.
enum class group_order {
  first_seen,    ///< by each key's first occurrence in the input (no sort; O(n))
  ascending_key  ///< by ascending key (adds an O(u log u) sort of the u unique keys)
};

/// A share of the keys for one of several workspaces that group and update in parallel: the
/// keys whose hash picks part `index` of `count`. Every occurrence of a key picks the same
/// part, so the parts are disjoint sets of keys and grouping each part on its own gives the
/// same groups (and sums) as grouping all keys. The default, {0, 1}, is every key.
struct key_share {
  std::size_t index = 0;
  std::size_t count = 1;

  /// Whether `key` belongs to this share (a multiplicative hash unrelated to key_groups' slots).
  [[nodiscard]] bool holds(std::uint64_t key) const noexcept {
    return static_cast<std::size_t>(((key * 0xd6e8feb86659fd93ull) >> 32) * count >> 32) == index;
  }
};

/// Reusable workspace that groups the occurrences of equal keys.
///
/// After `group(keys)`, group g < size() has key `key(g)` and `members(g)`: the positions i
/// with keys[i] == key(g), ascending (input order). After `group_bags(keys, offsets)` the
/// members are bag indices instead: position i of bag b (CSR offsets, bag b is
/// keys[offsets[b] .. offsets[b+1])) contributes b, so a bag that holds a key twice is listed
/// twice; still in input order. `max_key()` is the largest key seen (for a bounds check after
/// the grouping instead of a separate pass).
///
/// Method: one pass of open-addressing hashing (multiplicative hash, linear probing, 4-byte
/// slots holding a group id, load ≤ 1/4; sized from the previous call's unique count and
/// doubled when needed; branch-free apart from collisions) that numbers groups in order of
/// first occurrence and counts members, a prefix sum, and one scatter pass (a stable counting
/// sort of the positions by group): O(n), no sort unless `group_order::ascending_key` is asked
/// for. Strictly ascending keys skip the hashing. Buffers grow to the largest call seen and are
/// reused, so steady-state calls do not allocate. At most 2^32 − 2 keys per call. Not
/// thread-safe: one workspace per thread.
class key_groups {
 public:
  /// Groups the positions of `keys` (only those of `share`, if given).
  void group(std::span<const std::uint64_t> keys, group_order order = group_order::first_seen,
             key_share share = {}) {
    start(
        keys, order,
        [&](auto&& emit) {
          for (std::size_t i = 0; i < keys.size(); ++i)
            emit(i, static_cast<std::uint32_t>(i));
        },
        share);
  }

  /// Groups the bag indices of `keys` under CSR `offsets` (B + 1 entries, starting at 0,
  /// non-decreasing, ending at keys.size(); the caller validates them, e.g. with
  /// `embedding::check_offsets`). `share` as for `group`.
  void group_bags(std::span<const std::uint64_t> keys, std::span<const std::uint64_t> offsets,
                  group_order order = group_order::first_seen, key_share share = {}) {
    if (offsets.empty())
      fail(errc::invalid_argument, "key_groups::group_bags: offsets is empty; pass B + 1 offsets");
    if (offsets.size() - 1 >= limit)
      fail(errc::invalid_argument,
           cat("key_groups: ", offsets.size() - 1, " bags exceed 2^32 - 2; split the batch"));
    start(
        keys, order,
        [&](auto&& emit) {
          for (std::size_t b = 0; b + 1 < offsets.size(); ++b)
            for (std::size_t i = offsets[b]; i < offsets[b + 1]; ++i)
              emit(i, static_cast<std::uint32_t>(b));
        },
        share);
  }

  /// Number of groups (unique keys).
  [[nodiscard]] std::size_t size() const noexcept { return unique_; }
  /// Key of every group, in group order.
  [[nodiscard]] std::span<const std::uint64_t> keys() const noexcept {
    return {keys_.data() + 1, unique_};
  }
  [[nodiscard]] std::uint64_t key(std::size_t g) const noexcept { return keys_[g + 1]; }
  /// Members of group g (positions or bag indices), in input order.
  [[nodiscard]] std::span<const std::uint32_t> members(std::size_t g) const noexcept {
    return {members_.data() + starts_[g], starts_[g + 1] - starts_[g]};
  }
  /// Total number of members (the number of keys grouped).
  [[nodiscard]] std::size_t member_count() const noexcept { return member_count_; }
  /// Largest key of the last call (0 when it had no keys).
  [[nodiscard]] std::uint64_t max_key() const noexcept { return max_key_; }

 private:
  // Internally groups are numbered from 1 (keys_[h], counts_[h] for h = g + 1), so that 0 can
  // mean "empty slot" and keys_[0] / counts_[0] absorb the branch-free probe's dummy accesses.
  static constexpr std::size_t limit = std::size_t{0xffffffff} - 1;

  /// Pointer to at least n elements of v; v only grows (no per-call initialisation).
  template <class T>
  static T* at_least(std::vector<T>& v, std::size_t n) {
    if (v.size() < n) v.resize(n);
    return v.data();
  }

  /// log2 of the slots of an index for `unique` keys: load at most 1/4.
  static int index_bits(std::size_t unique) noexcept {
    return std::bit_width(std::max<std::size_t>(64, 4 * unique) - 1);
  }

  /// Slot of `key` in an index of 2^bits slots (Fibonacci hashing: the top bits of
  /// key · 2^64/φ depend on every bit of the key).
  static std::size_t slot_of(std::uint64_t key, int bits) noexcept {
    return static_cast<std::size_t>((key * 0x9e3779b97f4a7c15ull) >> (64 - bits));
  }

  /// Empties the index, sizes it to 2^bits slots and re-inserts groups 1 .. unique.
  std::uint32_t* reset_slots(int bits, std::size_t unique) {
    const std::size_t capacity = std::size_t{1} << bits, mask = capacity - 1;
    std::uint32_t* const slots = at_least(slots_, capacity);
    std::memset(slots, 0, capacity * sizeof(std::uint32_t));
    for (std::size_t h = 1; h <= unique; ++h) {
      std::size_t s = slot_of(keys_[h], bits);
      while (slots[s] != 0)
        s = (s + 1) & mask;
      slots[s] = static_cast<std::uint32_t>(h);
    }
    return slots;
  }

  /// Groups all keys, or first copies the keys of `share` (and their members) in input order
  /// and groups those. `for_each(emit)` calls emit(position, member) for every position in
  /// input order. max_key() covers all keys either way.
  template <class ForEach>
  void start(std::span<const std::uint64_t> keys, group_order order, const ForEach& for_each,
             key_share share) {
    if (share.count <= 1) return build(keys, order, for_each);
    if (keys.size() >= limit)
      fail(errc::invalid_argument,
           cat("key_groups: ", keys.size(), " keys exceed 2^32 - 2; split the batch"));
    std::uint64_t* const share_keys = at_least(share_keys_, keys.size());
    std::uint32_t* const share_members = at_least(share_members_, keys.size());
    std::size_t count = 0;
    std::uint64_t largest = 0;
    for_each([&](std::size_t i, std::uint32_t m) {  // branch-free compaction
      const std::uint64_t key = keys[i];
      largest = std::max(largest, key);
      share_keys[count] = key;
      share_members[count] = m;
      count += share.holds(key) ? 1 : 0;
    });
    build({share_keys, count}, order, [&](auto&& emit) {
      for (std::size_t i = 0; i < count; ++i)
        emit(i, share_members[i]);
    });
    max_key_ = largest;
  }

  template <class ForEach>
  void build(std::span<const std::uint64_t> keys, group_order order, const ForEach& for_each) {
    const std::size_t n = keys.size();
    if (n >= limit)
      fail(errc::invalid_argument,
           cat("key_groups: ", n, " keys exceed 2^32 - 2; split the batch"));
    member_count_ = n;
    std::uint32_t* const members = at_least(members_, n);
    std::uint64_t* const group_keys = at_least(keys_, n + 1);  // [0] is the dummy
    std::uint32_t* const starts = at_least(starts_, n + 1);
    const bool strictly_ascending =
        std::adjacent_find(keys.begin(), keys.end(), std::greater_equal<>{}) == keys.end();
    if (strictly_ascending) {  // every key is its own group, already in both orders
      unique_ = n;
      max_key_ = n > 0 ? keys[n - 1] : 0;
      std::copy(keys.begin(), keys.end(), group_keys + 1);
      for (std::size_t i = 0; i <= n; ++i)
        starts[i] = static_cast<std::uint32_t>(i);
      for_each([&](std::size_t i, std::uint32_t m) { members[i] = m; });
      return;
    }
    // 1. Hash: group of every position (numbered in order of first occurrence) and member
    //    counts. The index starts sized for the previous call's unique keys (batches of one
    //    job look alike, and a small index stays in cache) and doubles when a quarter full.
    //    The probe is branch-free but for collisions: a new key and a known one take the same
    //    path (selects, and stores that rewrite a known key's slot with the same values).
    std::uint32_t* const counts = at_least(counts_, n + 1);
    std::uint32_t* const group_of = at_least(group_of_, n);
    int bits = index_bits(std::min(n, last_unique_ > 0 ? last_unique_ : n));
    std::size_t mask = (std::size_t{1} << bits) - 1;
    std::size_t grow_at = (std::size_t{1} << bits) / 4;
    std::uint32_t* slots = reset_slots(bits, 0);
    std::uint32_t unique = 0;
    std::uint64_t largest = 0;
    group_keys[0] = 0;
    for (std::size_t i = 0; i < n; ++i) {
      const std::uint64_t key = keys[i];
      largest = std::max(largest, key);
      std::size_t s = slot_of(key, bits);
      std::uint32_t h = slots[s];
      while ((h != 0) & (group_keys[h] != key)) {
        s = (s + 1) & mask;
        h = slots[s];
      }
      const bool fresh = h == 0;
      h = fresh ? unique + 1 : h;
      unique += fresh ? 1u : 0u;
      slots[s] = h;
      group_keys[h] = key;
      counts[h] = (fresh ? 0u : counts[h]) + 1u;
      group_of[i] = h;
      if (unique > grow_at) [[unlikely]] {
        ++bits;
        mask = (std::size_t{1} << bits) - 1;
        grow_at = (std::size_t{1} << bits) / 4;
        slots = reset_slots(bits, unique);
      }
    }
    unique_ = unique;
    last_unique_ = unique;
    max_key_ = largest;
    // 2. Optionally renumber the groups by ascending key.
    if (order == group_order::ascending_key) {
      auto* const by_key = at_least(by_key_, unique);
      for (std::uint32_t h = 1; h <= unique; ++h)
        by_key[h - 1] = {group_keys[h], h};
      std::sort(by_key, by_key + unique,
                [](const auto& a, const auto& b) { return a.first < b.first; });
      std::uint32_t* const rank = at_least(rank_, unique + 1);
      std::uint32_t* const sorted_counts = at_least(sorted_counts_, unique + 1);
      for (std::uint32_t r = 1; r <= unique; ++r) {
        const std::uint32_t h = by_key[r - 1].second;
        rank[h] = r;
        group_keys[r] = by_key[r - 1].first;
        sorted_counts[r] = counts[h];
      }
      std::copy(sorted_counts + 1, sorted_counts + unique + 1, counts + 1);
      for (std::size_t i = 0; i < n; ++i)
        group_of[i] = rank[group_of[i]];
    }
    // 3. Stable counting sort of the members by group; counts become the write cursors.
    starts[0] = 0;
    for (std::uint32_t h = 1; h <= unique; ++h) {
      starts[h] = starts[h - 1] + counts[h];
      counts[h] = starts[h - 1];
    }
    for_each([&](std::size_t i, std::uint32_t m) { members[counts[group_of[i]]++] = m; });
  }

  // results (vectors only grow; the sizes below say how much is in use)
  std::vector<std::uint64_t> keys_;     // keys_[g + 1]: key of group g (keys_[0]: dummy)
  std::vector<std::uint32_t> starts_;   // group g is members_[starts_[g] .. starts_[g + 1])
  std::vector<std::uint32_t> members_;  // positions or bags, grouped, input order within
  std::size_t unique_ = 0;
  std::size_t member_count_ = 0;
  std::uint64_t max_key_ = 0;
  // scratch
  std::vector<std::uint32_t> slots_;     // hash slot → group + 1 (0: empty)
  std::vector<std::uint32_t> group_of_;  // position → group + 1
  std::vector<std::uint32_t> counts_;    // [group + 1]: members, then write cursors
  std::vector<std::pair<std::uint64_t, std::uint32_t>> by_key_;
  std::vector<std::uint32_t> rank_;
  std::vector<std::uint32_t> sorted_counts_;
  std::vector<std::uint64_t> share_keys_;  // the keys of a share, input order
  std::vector<std::uint32_t> share_members_;
  std::size_t last_unique_ = 0;  // unique keys of the previous call (sizes the index)
};

/// Reusable workspace that turns (keys, one gradient row per key) into (unique keys ascending,
/// one summed gradient row per unique key).
///
/// Determinism: rows of equal keys are summed in their original order (first occurrence copied,
/// the others added one by one), whatever the thread count, so results are bitwise
/// reproducible. Method: `key_groups` with `group_order::ascending_key` (O(n) hashing, an
/// O(u log u) sort of the u unique keys, an O(n) counting sort), then each unique row is summed
/// (tbb-parallel over keys when large). Already strictly ascending keys skip the grouping.
/// Buffers grow to the largest call seen and are reused, so steady-state calls do not allocate.
/// Not thread-safe: one workspace per thread. (To update rows without the summed buffer, use
/// `key_groups` + `apply_grouped`.)
class sparse_gradient {
 public:
  /// Sums the rows of `grads` (keys.size() × dim) that share a key. Throws
  /// `errc::size_mismatch` when grads.rows() != keys.size(). The result stays valid until the
  /// next call.
  void sum_duplicates(std::span<const std::uint64_t> keys, matrix_view<const float> grads) {
    if (grads.rows() != keys.size())
      fail(errc::size_mismatch, cat("sum_duplicates: ", keys.size(), " keys but ", grads.rows(),
                                    " gradient rows; pass exactly one gradient row per key"));
    const std::size_t n = keys.size();
    dim_ = grads.cols();
    groups_.group(keys, group_order::ascending_key);
    const std::size_t unique = groups_.size();
    values_.resize(unique * dim_);
    const auto row_of = [&](std::uint32_t i) { return grads.row(i).data(); };
    detail::with_dim(dim_, [&]<std::size_t Dim>() {
      const auto sum_groups = [&](std::size_t first, std::size_t last) {
        for (std::size_t g = first; g < last; ++g) {
          float* out = values_.data() + g * dim_;
          if constexpr (Dim > 0) {  // sum in registers, then store
            float acc[Dim];
            detail::sum_rows<Dim>(groups_.members(g), row_of, Dim, acc);
            std::copy(acc, acc + Dim, out);
          } else {
            detail::sum_rows<0>(groups_.members(g), row_of, dim_, out);
          }
        }
      };
      if (n * dim_ < detail::parallel_floats) {
        sum_groups(0, unique);
      } else {
        tbb::parallel_for(
            tbb::blocked_range<std::size_t>(0, unique, 64),
            [&](const tbb::blocked_range<std::size_t>& r) { sum_groups(r.begin(), r.end()); });
      }
    });
  }

  /// Unique keys, strictly ascending.
  [[nodiscard]] std::span<const std::uint64_t> keys() const noexcept { return groups_.keys(); }
  /// Summed gradient rows: row g belongs to keys()[g] (size() × dim()).
  [[nodiscard]] matrix_view<const float> grads() const noexcept {
    return {values_.data(), size(), dim_, dim_};
  }
  /// The same rows, writable (e.g. to scale or compress them in place).
  [[nodiscard]] matrix_view<float> grads() noexcept { return {values_.data(), size(), dim_, dim_}; }
  /// Number of unique keys.
  [[nodiscard]] std::size_t size() const noexcept { return groups_.size(); }
  /// Gradient row width.
  [[nodiscard]] std::size_t dim() const noexcept { return dim_; }
  /// How many input rows were summed into unique row g.
  [[nodiscard]] std::size_t count(std::size_t g) const noexcept {
    return groups_.members(g).size();
  }

 private:
  key_groups groups_;
  std::vector<float> values_;
  std::size_t dim_ = 0;
};

/// Owning result of the free `sum_duplicates`.
struct summed_gradient {
  std::vector<std::uint64_t> keys;  ///< unique keys, strictly ascending
  matrix<float> grads;              ///< keys.size() × dim summed rows
};

/// One-shot form of `sparse_gradient::sum_duplicates` (allocates its result; use a
/// `sparse_gradient` workspace in loops).
inline summed_gradient sum_duplicates(std::span<const std::uint64_t> keys,
                                      matrix_view<const float> grads) {
  sparse_gradient work;
  work.sum_duplicates(keys, grads);
  summed_gradient out{{work.keys().begin(), work.keys().end()},
                      matrix<float>(work.size(), work.dim())};
  const auto summed = work.grads();
  for (std::size_t g = 0; g < work.size(); ++g)
    std::copy(summed.row(g).begin(), summed.row(g).end(), out.grads.row(g).begin());
  return out;
}

/// Applies `opt` to unique rows: for each i in [0, grads.rows()), `locate(i)` returns the
/// `row_ref` of the i-th row and `opt.apply(row.weights, row.state, grads.row(i))` updates it.
///
/// Rows must be distinct (sum duplicates first); then updates are independent and run in
/// parallel with tbb::parallel_for once the work exceeds ~32 K floats, so `locate` must be safe
/// to call concurrently for distinct i (a read-only lookup). Throws `errc::size_mismatch` when
/// a located row is not grads.cols() wide or its state is smaller than
/// `O::state_floats(dim)`.
template <sparse_optimizer O, class Locate>
void apply_sparse(const O& opt, matrix_view<const float> grads, Locate&& locate) {
  const std::size_t dim = grads.cols();
  const std::size_t state = O::state_floats(dim);
  const auto body = [&](std::size_t first, std::size_t last) {
    for (std::size_t i = first; i < last; ++i) {
      const row_ref row = locate(i);
      if (row.weights.size() != dim || row.state.size() < state) [[unlikely]]
        fail(errc::size_mismatch,
             cat("apply_sparse(", O::name, "): row ", i, " has ", row.weights.size(),
                 " weights and ", row.state.size(), " state floats, expected ", dim, " and ", state,
                 "; the gradient width must equal the table dim"));
      opt.apply(row.weights, row.state.first(state), grads.row(i));
    }
  };
  const std::size_t n = grads.rows();
  if (n * (dim + state) < detail::parallel_floats) {
    body(0, n);
  } else {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, n, 32),
                      [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); });
  }
}

/// Whether `apply_grouped` may use tbb.
enum class parallelism {
  automatic,  ///< tbb-parallel over groups when the work is large (~256 K floats or more)
  serial      ///< on the calling thread (e.g. inside a task that already runs in parallel)
};

/// Fused sum-and-apply over grouped keys: for each group g of `groups`,
/// ```
/// grad = row_of(m₀) + row_of(m₁) + …   (members(g) in order: first copied, others added)
/// opt.apply(locate(g).weights, locate(g).state, grad)
/// ```
/// `row_of(member)` returns `const float*` to `dim` floats (e.g. a row of per-key gradients,
/// or of per-bag output gradients after `key_groups::group_bags`); `locate(g)` returns the
/// `row_ref` of group g's row. Bitwise equal to `sparse_gradient::sum_duplicates` followed by
/// `apply_sparse`, but each sum lives in a small accumulator (registers for dims 8–128) and
/// its row is updated at once: no summed-gradient buffer, one pass. Table rows are prefetched
/// `detail::prefetch_groups` groups ahead. With `parallelism::automatic` it runs tbb-parallel
/// over groups only when the work exceeds ~256 K floats, so `row_of` and `locate` must be safe
/// to call concurrently for distinct groups. Throws `errc::size_mismatch` (before updating that
/// row, after updating the earlier ones) when a located row is not `dim` wide or its state is
/// smaller than `O::state_floats(dim)`; validate rows beforehand where partial updates matter.
template <sparse_optimizer O, class RowOf, class Locate>
void apply_grouped(const O& opt, const key_groups& groups, std::size_t dim, RowOf&& row_of,
                   Locate&& locate, parallelism mode = parallelism::automatic) {
  const std::size_t state = O::state_floats(dim);
  const std::size_t count = groups.size();
  if (count == 0) return;
  detail::with_dim(dim, [&]<std::size_t Dim>() {
    const auto body = [&](std::size_t first, std::size_t last) {
      // A local copy of the optimizer: its hyper-parameters cannot alias the rows it writes,
      // so the compiler keeps them in registers and vectorises the update.
      const O local_opt = opt;
      float fixed[Dim > 0 ? Dim : 1];
      std::vector<float> dynamic(Dim > 0 ? 0 : dim);
      float* const sum = Dim > 0 ? fixed : dynamic.data();
      const std::size_t fixed_state = Dim > 0 ? O::state_floats(Dim) : 0;
      const auto prefetch = [&](std::size_t g) {
        const row_ref row = locate(g);
        detail::prefetch_for_write(row.weights.data(), Dim > 0 ? Dim : row.weights.size());
        detail::prefetch_for_write(row.state.data(), Dim > 0 ? fixed_state : row.state.size());
      };
      for (std::size_t g = first; g < std::min(last, first + detail::prefetch_groups); ++g)
        prefetch(g);
      for (std::size_t g = first; g < last; ++g) {
        if (g + detail::prefetch_groups < last) prefetch(g + detail::prefetch_groups);
        detail::sum_rows<Dim>(groups.members(g), row_of, dim, sum);
        const row_ref row = locate(g);
        if (row.weights.size() != dim || row.state.size() < state) [[unlikely]]
          fail(errc::size_mismatch, cat("apply_grouped(", O::name, "): row of key ", groups.key(g),
                                        " has ", row.weights.size(), " weights and ",
                                        row.state.size(), " state floats, expected ", dim, " and ",
                                        state, "; the gradient width must equal the table dim"));
        // Spans of compile-time length when Dim > 0, so the optimizer's loops are unrolled
        // (and vectorised where its math allows: SGD's is, sqrt with errno is not).
        local_opt.apply(std::span<float>(row.weights.data(), Dim > 0 ? Dim : dim),
                        std::span<float>(row.state.data(), Dim > 0 ? fixed_state : state),
                        std::span<const float>(sum, Dim > 0 ? Dim : dim));
      }
    };
    const std::size_t work = groups.member_count() * dim + count * (dim + state);
    if (mode == parallelism::serial || work < detail::grouped_parallel_floats ||
        detail::usable_threads() < 2) {
      body(0, count);
    } else {
      // Tasks of at least grouped_parallel_floats / 4 floats of (average) work each.
      const std::size_t tasks =
          std::max<std::size_t>(2, work / (detail::grouped_parallel_floats / 4));
      const std::size_t grain = std::max<std::size_t>(1, count / tasks);
      tbb::parallel_for(
          tbb::blocked_range<std::size_t>(0, count, grain),
          [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); });
    }
  });
}

}  // namespace strata::optim

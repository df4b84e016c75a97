/// @file row_cache.cuh
/// `row_cache<Backing>`: a device cache of hot embedding rows in front of a host embedding
/// storage (`embedding::local`, `hash_table`, or `sharded` rows on parameter servers), so a GPU
/// worker re-pulls only the rows it has not used recently. The policy (slots, LRU eviction,
/// staleness) is embedding::cache_directory; this header moves the rows.
#pragma once

#if !defined(__CUDACC__)
#error \
    "strata/cuda/*.cuh are CUDA headers: include them only from .cu files compiled by nvcc (link strata::cuda)."
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/cuda/common.cuh"
#include "strata/embedding/cache_directory.hpp"
#include "strata/embedding/concepts.hpp"

namespace strata::cuda {

/// Choices of a row_cache.
struct row_cache_options {
  /// Forget a key's cached row when `apply_gradients` writes it, so the next gather refetches
  /// the updated row (read-your-writes, as a worker of ps::bounded<S> expects for its own
  /// pushes). When false, the worker's own updates become visible only when the cached row
  /// ages past max_staleness — acceptable only where training tolerates reading rows that miss
  /// the worker's own last S updates.
  bool invalidate_on_write = true;
};

/// Cumulative counters of one table of a row_cache.
struct row_cache_stats {
  std::uint64_t lookups = 0;        ///< keys gathered, duplicates included
  std::uint64_t hits = 0;           ///< distinct keys per gather served from the device cache
  std::uint64_t misses = 0;         ///< distinct keys per gather fetched from the backing storage
  std::uint64_t evictions = 0;      ///< cached rows dropped to make room
  std::uint64_t invalidations = 0;  ///< cached rows forgotten (writes, `invalidate`, `clear`)
  /// Bytes copied host → device: fetched rows (misses × dim × 4) and slot indices
  /// ((misses + keys) × 4).
  std::uint64_t bytes_host_to_device = 0;
  /// Row bytes not copied thanks to the cache: hits × dim × 4 (against a pass-through that
  /// copies every distinct key of a gather once).
  std::uint64_t bytes_saved = 0;
};

namespace detail {
// Kernel templates (instantiated for float only) so that several .cu files of one program may
// include this header without duplicate kernel symbols.

/// cache[slots[j]] ← rows[j] for j < count (rows of dim floats; the slots are distinct).
template <class T>
__global__ void cache_scatter_kernel(const T* __restrict rows,
                                     const std::uint32_t* __restrict slots, std::size_t count,
                                     std::size_t dim, T* __restrict cache) {
  const std::size_t total = count * dim;
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < total;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t j = idx / dim, c = idx % dim;
    cache[std::size_t{slots[j]} * dim + c] = rows[idx];
  }
}

/// out[i] ← cache[slots[i]] for i < count (rows of dim floats).
template <class T>
__global__ void cache_gather_kernel(const T* __restrict cache,
                                    const std::uint32_t* __restrict slots, std::size_t count,
                                    std::size_t dim, T* __restrict out) {
  const std::size_t total = count * dim;
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < total;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i = idx / dim, c = idx % dim;
    out[idx] = cache[std::size_t{slots[i]} * dim + c];
  }
}
}  // namespace detail

/// A device cache of embedding rows in front of a host storage `Backing` (any
/// embedding::storage: `local`, `hash_table`, `sharded`).
///
/// Per table: `capacity` rows of dim floats in device memory and an embedding::cache_directory
/// (LRU slots; a row is reused while at most `max_staleness` steps old — see there for when
/// that is legal: S = 0 is an exact pass-through across steps, S under ps::bounded<S>).
///
/// `gather(t, keys, out, step)`, all stream-ordered on the cache's stream:
/// 1. the directory plans the batch (slot per key; distinct keys to fetch);
/// 2. the host waits for the previous gather's host→device copies (an event; not its kernels)
///    so that the pinned staging buffers may be refilled;
/// 3. `backing.gather` writes the missing rows straight into pinned host memory;
/// 4. rows and slot indices are copied (cudaMemcpyAsync) to device staging buffers;
/// 5. a kernel scatters the fetched rows into their slots; a kernel writes
///    out[i] = cache[slot[i]].
/// `out` (device, keys.size() × dim, row-major) is ready when the stream reaches this point:
/// synchronise the stream or order other streams after it (cuda::event). The call returns
/// once the work is queued; the next gather's backing fetch (e.g. a PS pull) then overlaps
/// this one's kernels, after waiting only for this one's (short) host→device copies.
///
/// `apply_gradients(t, keys, grads)` forwards host gradients to `backing.apply_gradients` and,
/// with `invalidate_on_write` (default), forgets those keys first.
///
/// Output rows equal `backing.gather` bit for bit whenever the backing has not changed a
/// cached row since it was fetched; otherwise a row is at most max_staleness steps old.
/// Cost per gather: the directory's O(keys) plan, one backing gather of the misses, two
/// host→device copies ((misses × dim + misses + keys) × 4 bytes), two kernels.
/// Memory: capacity × dim × 4 device bytes per table, plus staging (host pinned and device)
/// for the largest gather. Errors: `strata::error` naming the table (see each call); a batch
/// with more distinct keys than the capacity is refused (errc::invalid_argument) without
/// changing the cache. If the backing gather throws, the batch's fetched keys are forgotten
/// and the error propagates; the cache stays consistent.
/// Thread-safety: none — one thread drives a row_cache and its stream. The stream and the
/// backing must outlive the cache, which is neither copyable nor movable.
///
/// ```cpp
/// cuda::row_cache cache(storage, /*capacity_rows=*/1 << 20, /*max_staleness=*/2, stream);
/// cache.gather(0, batch_keys, device_rows, step);     // device_rows: keys × dim
/// cache.apply_gradients(0, batch_keys, host_grads);   // forwards, forgets the keys
/// ```
template <embedding::storage Backing>
class row_cache {
 public:
  /// A cache of `capacity_rows[t]` rows for table t of `backing` (one entry per table).
  /// Throws errc::size_mismatch when the count differs from backing.table_count(),
  /// errc::invalid_argument for a capacity of 0 or a table of dim 0.
  row_cache(Backing& backing, const std::vector<std::size_t>& capacity_rows,
            std::uint64_t max_staleness, cudaStream_t stream, row_cache_options options = {})
      : backing_(backing),
        stream_(stream),
        options_(options),
        staged_rows_(0, stream),
        staged_slots_(0, stream) {
    const std::size_t count = backing.table_count();
    if (capacity_rows.size() != count)
      fail(errc::size_mismatch,
           cat("cuda::row_cache: ", capacity_rows.size(), " capacities given for ", count,
               " tables of the backing storage; pass one capacity per table"));
    tables_.reserve(count);
    for (std::size_t t = 0; t < count; ++t) {
      const embedding::table_spec& spec = backing.spec(t);
      const std::string name = cat("cuda::row_cache table ", t, " '", spec.name, "'");
      STRATA_EXPECTS(spec.dim > 0, name, " has dim 0; every cached table needs dim > 0");
      embedding::cache_directory dir(capacity_rows[t], max_staleness, name);
      device_buffer<float> rows(capacity_rows[t] * spec.dim, stream);
      rows.fill_bytes(0xff);  // NaN until fetched: a slot read before its row arrives shows
      tables_.push_back(table{spec, std::move(dir), std::move(rows), 0, 0});
    }
  }

  /// The same capacity for every table.
  row_cache(Backing& backing, std::size_t capacity_rows, std::uint64_t max_staleness,
            cudaStream_t stream, row_cache_options options = {})
      : row_cache(backing, std::vector<std::size_t>(backing.table_count(), capacity_rows),
                  max_staleness, stream, options) {}

  row_cache(const row_cache&) = delete;
  row_cache& operator=(const row_cache&) = delete;

  /// Waits for queued copies from the pinned staging buffers before freeing them; device
  /// buffers are freed in stream order.
  ~row_cache() { (void)cudaEventSynchronize(copies_done_.get()); }

  [[nodiscard]] std::size_t table_count() const noexcept { return tables_.size(); }
  [[nodiscard]] const embedding::table_spec& spec(std::size_t t) const {
    return checked(t, "spec").spec;
  }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] const row_cache_options& options() const noexcept { return options_; }
  [[nodiscard]] Backing& backing() noexcept { return backing_; }
  /// The slot policy of table t (read-only: slots, fetch steps, counters).
  [[nodiscard]] const embedding::cache_directory& directory(std::size_t t) const {
    return checked(t, "directory").dir;
  }
  /// The cached rows of table t (device, capacity × dim; slot s is row s).
  [[nodiscard]] const float* device_rows(std::size_t t) const {
    return checked(t, "device_rows").rows.data();
  }

  /// out (device, keys.size() × dim of table t) ← the rows of `keys` at training step `step`,
  /// from the cache or fetched from the backing storage (see the class comment). Keys may
  /// repeat. Throws errc::out_of_range for a bad table, errc::invalid_argument for more
  /// distinct keys than the table's capacity or a null `out`; errors of the backing (a bad
  /// key) propagate.
  void gather(std::size_t t, std::span<const std::uint64_t> keys, float* out, std::uint64_t step) {
    table& tab = checked(t, "gather");
    if (keys.empty()) return;
    STRATA_EXPECTS(out != nullptr, "cuda::row_cache::gather: table ", t, " '", tab.spec.name,
                   "': out is null; pass a device array of ", keys.size(), " x ", tab.spec.dim,
                   " floats");
    const std::uint64_t hits_before = tab.dir.stats().hits;
    const embedding::cache_plan plan = tab.dir.plan(keys, step);  // throws before any change
    const std::size_t n = keys.size(), m = plan.fetch_keys.size(), dim = tab.spec.dim;
    try {
      // The pinned buffers may still feed the previous gather's copies: wait for them (not
      // for its kernels) before refilling or reallocating them.
      copies_done_.synchronize();
      host_slots_.reserve(m + n);
      staged_slots_.reserve(m + n);  // stream-ordered: earlier kernels finish with the old one
      if (m > 0) {
        host_rows_.reserve(m * dim);
        staged_rows_.reserve(m * dim);
        backing_.gather(t, plan.fetch_keys, matrix_view<float>(host_rows_.data(), m, dim));
      }
      std::copy(plan.fetch_slots.begin(), plan.fetch_slots.end(), host_slots_.data());
      std::copy(plan.slots.begin(), plan.slots.end(), host_slots_.data() + m);
      STRATA_CHECK(cudaMemcpyAsync(staged_slots_.data(), host_slots_.data(),
                                   (m + n) * sizeof(std::uint32_t), cudaMemcpyHostToDevice,
                                   stream_));
      if (m > 0)
        STRATA_CHECK(cudaMemcpyAsync(staged_rows_.data(), host_rows_.data(),
                                     m * dim * sizeof(float), cudaMemcpyHostToDevice, stream_));
      copies_done_.record(stream_);
      if (m > 0) {
        detail::cache_scatter_kernel<float><<<grid_for(m * dim), 256, 0, stream_>>>(
            staged_rows_.data(), staged_slots_.data(), m, dim, tab.rows.data());
        check_launch("cache_scatter_kernel", stream_);
      }
      detail::cache_gather_kernel<float><<<grid_for(n * dim), 256, 0, stream_>>>(
          tab.rows.data(), staged_slots_.data() + m, n, dim, out);
      check_launch("cache_gather_kernel", stream_);
    } catch (...) {
      tab.dir.invalidate(plan.fetch_keys);  // their rows never reached the device
      throw;
    }
    tab.bytes_host_to_device += m * dim * sizeof(float) + (m + n) * sizeof(std::uint32_t);
    tab.bytes_saved += (tab.dir.stats().hits - hits_before) * dim * sizeof(float);
  }

  /// As above, with the output's size checked: throws errc::size_mismatch, naming the table,
  /// unless out (device) holds keys.size() × dim floats.
  void gather(std::size_t t, std::span<const std::uint64_t> keys, std::span<float> out,
              std::uint64_t step) {
    const table& tab = checked(t, "gather");
    if (out.size() != keys.size() * tab.spec.dim)
      fail(errc::size_mismatch,
           cat("cuda::row_cache::gather: out holds ", out.size(), " floats but table ", t, " '",
               tab.spec.name, "' needs ", keys.size(), " x ", tab.spec.dim,
               " (one row of dim values per key)"));
    gather(t, keys, out.data(), step);
  }

  /// Applies host gradients (grads.row(i) for keys[i]) through `backing.apply_gradients`; with
  /// `invalidate_on_write` the keys' cached rows are forgotten first, so the next gather
  /// fetches the updated rows (how soon the backing shows the update is its own consistency:
  /// a `sharded` storage under ps::async may still serve the old row). Throws errc::out_of_range
  /// for a bad table, errc::size_mismatch unless grads is keys.size() × dim.
  void apply_gradients(std::size_t t, std::span<const std::uint64_t> keys,
                       matrix_view<const float> grads) {
    table& tab = checked(t, "apply_gradients");
    if (grads.rows() != keys.size() || grads.cols() != tab.spec.dim)
      fail(errc::size_mismatch,
           cat("cuda::row_cache::apply_gradients: grads is ", grads.rows(), " x ", grads.cols(),
               " but table ", t, " '", tab.spec.name, "' needs ", keys.size(), " x ", tab.spec.dim,
               " (one row of dim values per key)"));
    if (options_.invalidate_on_write) tab.dir.invalidate(keys);
    backing_.apply_gradients(t, keys, grads);
  }

  /// Forgets `keys` of table t (the next gather refetches them); returns how many were cached.
  std::size_t invalidate(std::size_t t, std::span<const std::uint64_t> keys) {
    return checked(t, "invalidate").dir.invalidate(keys);
  }
  /// Forgets every cached row of every table (e.g. after loading a checkpoint into the backing).
  void clear() noexcept {
    for (auto& tab : tables_)
      tab.dir.clear();
  }

  /// Counters of table t since construction.
  [[nodiscard]] row_cache_stats stats(std::size_t t) const {
    const table& tab = checked(t, "stats");
    const embedding::cache_stats& d = tab.dir.stats();
    return {d.lookups,      d.hits,          d.misses,
            d.evictions,    d.invalidations, tab.bytes_host_to_device,
            tab.bytes_saved};
  }

  /// Waits for everything queued on the cache's stream; throws on an asynchronous error.
  void synchronize() const { STRATA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  struct table {
    embedding::table_spec spec;
    embedding::cache_directory dir;
    device_buffer<float> rows;  // capacity × dim; slot s is row s
    std::uint64_t bytes_host_to_device = 0;
    std::uint64_t bytes_saved = 0;
  };

  table& checked(std::size_t t, const char* who) {
    if (t >= tables_.size())
      fail(errc::out_of_range,
           cat("cuda::row_cache::", who, ": table ", t, " does not exist (the backing storage has ",
               tables_.size(), " tables)"));
    return tables_[t];
  }
  const table& checked(std::size_t t, const char* who) const {
    return const_cast<row_cache&>(*this).checked(t, who);
  }

  Backing& backing_;
  cudaStream_t stream_;
  row_cache_options options_;
  std::vector<table> tables_;
  // Staging shared by all tables (one stream): pinned host arrays the backing writes into, and
  // their device twins. copies_done_ marks the end of the last copies out of the pinned ones.
  pinned_buffer<float> host_rows_;
  pinned_buffer<std::uint32_t> host_slots_;  // fetch slots, then one slot per key
  device_buffer<float> staged_rows_;
  device_buffer<std::uint32_t> staged_slots_;
  event copies_done_;
};

}  // namespace strata::cuda

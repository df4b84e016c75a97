/// @file embedding.cuh
/// Device embedding kernels: pooled gather over CSR bags, its backward (unpool), and the sparse
/// row update — duplicate keys de-duplicated with CUB radix sort + run-length encoding, each
/// unique key's gradient rows summed in original order (no float atomics: bitwise
/// deterministic), then SGD / Adagrad / Adam / FTRL applied row-wise with the formulas of
/// include/strata/optim/*.hpp. `local<Optimizer>` is a device-resident table set built on them.
#pragma once

#if !defined(__CUDACC__)
#error \
    "strata/cuda/*.cuh are CUDA headers: include them only from .cu files compiled by nvcc (link strata::cuda)."
#endif

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

#include "strata/cuda/common.cuh"
#include "strata/embedding/concepts.hpp"
#include "strata/embedding/init.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/adam.hpp"
#include "strata/optim/ftrl.hpp"
#include "strata/optim/sgd.hpp"

namespace strata::cuda {

/// How a bag's rows are combined (as strata::embedding::pooling).
enum class pooling {
  sum,   ///< out = Σ rows
  mean,  ///< out = Σ rows / bag length (an empty bag gives zeros)
};

/// A contiguous rows × cols float array in device memory (non-owning).
template <class T>
struct device_matrix {
  T* data = nullptr;
  std::size_t rows = 0;
  std::size_t cols = 0;
};

// ---------------------------------------------------------------------------------------------
// Row-wise optimizer math on the device. Each optimizer gives prepare (per-row scalars),
// element (one coordinate) and finish (per-row state write-back). Products and sums use the
// _rn intrinsics so nvcc never contracts them into FMAs: the arithmetic is the CPU formula's,
// operation for operation (see include/strata/optim/*.hpp).
// ---------------------------------------------------------------------------------------------
namespace detail {

// Every kernel here is a template (the plain ones `template <int = 0>`, launched as f<<<…>>>)
// so that it has vague linkage: several .cu files of one program may include this header
// without duplicate kernel symbols at link time.
struct row_scalars {
  float correct1 = 1.0f;
  float correct2 = 1.0f;
  float steps = 0.0f;
};

__device__ inline row_scalars prepare(const optim::sgd&, const float*, std::size_t) {
  return {};
}
__device__ inline void element(const optim::sgd& o, float* w, float*, std::size_t, std::size_t c,
                               float g, const row_scalars&) {
  w[c] = __fsub_rn(w[c], __fmul_rn(o.lr, g));
}
__device__ inline void finish(const optim::sgd&, float*, std::size_t, const row_scalars&) {}

__device__ inline row_scalars prepare(const optim::adagrad&, const float*, std::size_t) {
  return {};
}
__device__ inline void element(const optim::adagrad& o, float* w, float* acc, std::size_t,
                               std::size_t c, float g, const row_scalars&) {
  const float a = __fadd_rn(acc[c], __fmul_rn(g, g));
  acc[c] = a;
  const float den = __fadd_rn(__fsqrt_rn(__fadd_rn(a, o.initial_accumulator)), o.eps);
  w[c] = __fsub_rn(w[c], __fdiv_rn(__fmul_rn(o.lr, g), den));
}
__device__ inline void finish(const optim::adagrad&, float*, std::size_t, const row_scalars&) {}

__device__ inline row_scalars prepare(const optim::adam& o, const float* state, std::size_t dim) {
  row_scalars r;
  r.steps = __fadd_rn(state[2 * dim], 1.0f);
  const double t = r.steps;
  r.correct1 = static_cast<float>(1.0 / (1.0 - pow(static_cast<double>(o.beta1), t)));
  r.correct2 = static_cast<float>(1.0 / (1.0 - pow(static_cast<double>(o.beta2), t)));
  return r;
}
__device__ inline void element(const optim::adam& o, float* w, float* state, std::size_t dim,
                               std::size_t c, float g, const row_scalars& r) {
  float* m = state;
  float* v = state + dim;
  const float mc = __fadd_rn(__fmul_rn(o.beta1, m[c]), __fmul_rn(__fsub_rn(1.0f, o.beta1), g));
  const float vc =
      __fadd_rn(__fmul_rn(o.beta2, v[c]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, o.beta2), g), g));
  m[c] = mc;
  v[c] = vc;
  const float num = __fmul_rn(o.lr, __fmul_rn(mc, r.correct1));
  const float den = __fadd_rn(__fsqrt_rn(__fmul_rn(vc, r.correct2)), o.eps);
  w[c] = __fsub_rn(w[c], __fdiv_rn(num, den));
}
__device__ inline void finish(const optim::adam&, float* state, std::size_t dim,
                              const row_scalars& r) {
  state[2 * dim] = r.steps;
}

__device__ inline row_scalars prepare(const optim::ftrl&, const float*, std::size_t) {
  return {};
}
__device__ inline void element(const optim::ftrl& o, float* w, float* state, std::size_t dim,
                               std::size_t c, float g, const row_scalars&) {
  float* z = state;
  float* n = state + dim;
  const float inv_alpha = __fdiv_rn(1.0f, o.alpha);
  const float n_new = __fadd_rn(n[c], __fmul_rn(g, g));
  const float sqrt_new = __fsqrt_rn(n_new);
  const float sigma = __fmul_rn(__fsub_rn(sqrt_new, __fsqrt_rn(n[c])), inv_alpha);
  const float zc = __fadd_rn(z[c], __fsub_rn(g, __fmul_rn(sigma, w[c])));
  z[c] = zc;
  n[c] = n_new;
  w[c] = fabsf(zc) <= o.l1
             ? 0.0f
             : -__fdiv_rn(__fsub_rn(zc, copysignf(o.l1, zc)),
                          __fadd_rn(__fmul_rn(__fadd_rn(o.beta, sqrt_new), inv_alpha), o.l2));
}
__device__ inline void finish(const optim::ftrl&, float*, std::size_t, const row_scalars&) {}

/// Optimizers with device kernels.
template <class O>
concept device_optimizer = requires(const O& o, float* p, std::size_t d, const row_scalars& r) {
  { O::state_floats(d) } -> std::convertible_to<std::size_t>;
  prepare(o, p, d);
};

/// One thread per (bag, column): out[b][c] = Σ table[keys[i]][c] over the bag, in key order,
/// then × 1/len for mean (len > 1) — the CPU's operation order, so results are bitwise equal.
/// A key ≥ rows contributes NaN and raises *bad_key when bad_key is not null (it is never read).
template <int = 0>
__global__ void pooled_gather_kernel(const float* __restrict table, std::uint64_t rows,
                                     std::size_t dim, const std::uint64_t* __restrict keys,
                                     const std::uint64_t* __restrict offsets, std::size_t bags,
                                     bool mean, float* __restrict out, int* bad_key) {
  const std::size_t total = bags * dim;
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < total;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t b = idx / dim, c = idx % dim;
    const std::uint64_t first = offsets[b], last = offsets[b + 1];
    float sum = 0.0f;
    for (std::uint64_t i = first; i < last; ++i) {
      const std::uint64_t k = __ldg(keys + i);
      if (k >= rows) {
        sum = __int_as_float(0x7fc00000);
        if (c == 0 && bad_key != nullptr) atomicOr(bad_key, 1);
        continue;
      }
      sum = __fadd_rn(sum, __ldg(table + k * dim + c));
    }
    const std::uint64_t len = last - first;
    const float scale = mean && len > 1 ? __fdiv_rn(1.0f, static_cast<float>(len)) : 1.0f;
    out[idx] = __fmul_rn(sum, scale);
  }
}

/// key_grads[i][c] = d_out[bag(i)][c] × (mean ? 1/len : 1); bag(i) by binary search.
template <int = 0>
__global__ void unpool_kernel(const float* __restrict d_out,
                              const std::uint64_t* __restrict offsets, std::size_t bags,
                              std::size_t dim, std::size_t key_count, bool mean,
                              float* __restrict key_grads) {
  const std::size_t total = key_count * dim;
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < total;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t i = idx / dim, c = idx % dim;
    std::size_t lo = 0, hi = bags;  // last bag b with offsets[b] <= i < offsets[b + 1]
    while (hi - lo > 1) {
      const std::size_t mid = (lo + hi) / 2;
      if (offsets[mid] <= i)
        lo = mid;
      else
        hi = mid;
    }
    while (lo + 1 < bags && offsets[lo + 1] <= i)
      ++lo;  // skip empty bags at the boundary
    const std::uint64_t len = offsets[lo + 1] - offsets[lo];
    const float scale = mean ? __fdiv_rn(1.0f, static_cast<float>(len)) : 1.0f;
    key_grads[idx] = __fmul_rn(d_out[lo * dim + c], scale);
  }
}

template <int = 0>
__global__ void iota_kernel(std::uint32_t* out, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<std::uint32_t>(i);
}

/// One warp per unique key u < *runs: g[c] = Σ grads[pos][c] over the key's occurrences in
/// original order (first copied, the rest added, as optim::sparse_gradient), then the optimizer
/// updates row unique[u]. Writes the summed row to summed (if not null). Deterministic.
template <class O>
__global__ void sum_and_apply_kernel(O opt, const std::uint64_t* __restrict unique,
                                     const std::uint32_t* __restrict run_start,
                                     const std::uint32_t* __restrict run_len,
                                     const int* __restrict runs,
                                     const std::uint32_t* __restrict sorted_pos,
                                     const float* __restrict grads, std::size_t dim, float* weights,
                                     float* state, std::size_t state_floats, float* summed) {
  const std::size_t warp = (blockIdx.x * std::size_t{blockDim.x} + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  if (warp >= static_cast<std::size_t>(*runs)) return;
  const std::uint64_t key = unique[warp];
  const std::uint32_t start = run_start[warp], len = run_len[warp];
  float* w = weights + key * dim;
  float* s = state + key * state_floats;
  const row_scalars r = prepare(opt, s, dim);
  __syncwarp();
  for (std::size_t c = lane; c < dim; c += 32) {
    float g = grads[std::size_t{sorted_pos[start]} * dim + c];
    for (std::uint32_t j = 1; j < len; ++j)
      g = __fadd_rn(g, grads[std::size_t{sorted_pos[start + j]} * dim + c]);
    if (summed != nullptr) summed[warp * dim + c] = g;
    element(opt, w, s, dim, c, g, r);
  }
  __syncwarp();
  if (lane == 0) finish(opt, s, dim, r);
}

inline int bits_for(std::uint64_t rows) {
  int bits = 1;
  while (bits < 64 && (std::uint64_t{1} << bits) < rows)
    ++bits;
  return bits;
}
}  // namespace detail

/// out (bags × dim) ← sum/mean over each CSR bag of table rows (device pointers; offsets has
/// bags + 1 entries). One thread per output value; reads each gathered row once, coalesced.
/// Keys ≥ rows give NaN and set *bad_key (a device int the caller may check). Async on stream.
inline void pooled_gather(device_matrix<const float> table, const std::uint64_t* keys,
                          const std::uint64_t* offsets, std::size_t bags, pooling mode, float* out,
                          int* bad_key, cudaStream_t stream) {
  if (bags == 0 || table.cols == 0) return;
  const std::size_t total = bags * table.cols;
  detail::pooled_gather_kernel<<<grid_for(total), 256, 0, stream>>>(
      table.data, table.rows, table.cols, keys, offsets, bags, mode == pooling::mean, out, bad_key);
  check_launch("pooled_gather_kernel", stream);
}

/// key_grads (key_count × dim) ← gradient of each key's row from d_out (bags × dim): the
/// backward of pooled_gather (as strata::embedding::unpool). Async on stream.
inline void unpool(const float* d_out, const std::uint64_t* offsets, std::size_t bags,
                   std::size_t dim, std::size_t key_count, pooling mode, float* key_grads,
                   cudaStream_t stream) {
  if (key_count == 0 || dim == 0) return;
  detail::unpool_kernel<<<grid_for(key_count * dim), 256, 0, stream>>>(
      d_out, offsets, bags, dim, key_count, mode == pooling::mean, key_grads);
  check_launch("unpool_kernel", stream);
}

/// Reusable workspace for sparse updates: keys → (sorted keys, original positions) by
/// cub::DeviceRadixSort::SortPairs (stable, so equal keys keep input order), unique keys and run
/// lengths by cub::DeviceRunLengthEncode::Encode, run starts by cub::DeviceScan::ExclusiveSum,
/// then one warp per unique key sums its rows in order and applies the optimizer.
/// Cost: O(n · sort passes) for keys (passes = ceil(bits(rows) / 8)), one read of every
/// gradient row and one read-modify-write of every touched row. Buffers grow to the largest call
/// and are reused. Not thread-safe; stream-ordered on the stream given to `apply`.
class sparse_update {
 public:
  // Every buffer lives on `stream`: a default-constructed one would grow on the legacy default
  // stream, whose frees do not wait for the work queued here.
  explicit sparse_update(cudaStream_t stream)
      : stream_(stream),
        positions_(0, stream),
        sorted_pos_(0, stream),
        run_len_(0, stream),
        run_start_(0, stream),
        sorted_keys_(0, stream),
        unique_(0, stream),
        runs_(0, stream),
        summed_(0, stream),
        temp_(0, stream) {}

  /// Applies grads (n × dim rows, device) of keys (n, device, each < rows) to weights/state
  /// (rows × dim and rows × state_floats, device). When `keep_summed` is set, the unique keys
  /// and summed rows stay readable through unique_keys()/summed_grads()/unique_count().
  template <class O>
  void apply(const O& opt, const std::uint64_t* keys, const float* grads, std::size_t n,
             std::size_t dim, std::uint64_t rows, float* weights, float* state,
             bool keep_summed = false) {
    STRATA_EXPECTS(n < (std::size_t{1} << 31), "cuda::sparse_update: ", n,
                   " keys in one call; split the update into calls of fewer than 2^31 keys");
    if (n == 0) {
      unique_count_ = 0;
      return;
    }
    reserve(n, dim, keep_summed);
    const int end_bit = detail::bits_for(rows);
    detail::iota_kernel<<<grid_for(n), 256, 0, stream_>>>(positions_.data(), n);
    check_launch("iota_kernel", stream_);
    std::size_t bytes = 0;
    STRATA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, sorted_keys_.data(),
                                                 positions_.data(), sorted_pos_.data(),
                                                 static_cast<int>(n), 0, end_bit, stream_));
    temp(bytes);
    STRATA_CHECK(cub::DeviceRadixSort::SortPairs(temp_.data(), bytes, keys, sorted_keys_.data(),
                                                 positions_.data(), sorted_pos_.data(),
                                                 static_cast<int>(n), 0, end_bit, stream_));
    bytes = 0;
    STRATA_CHECK(cub::DeviceRunLengthEncode::Encode(nullptr, bytes, sorted_keys_.data(),
                                                    unique_.data(), run_len_.data(), runs_.data(),
                                                    static_cast<int>(n), stream_));
    temp(bytes);
    STRATA_CHECK(cub::DeviceRunLengthEncode::Encode(temp_.data(), bytes, sorted_keys_.data(),
                                                    unique_.data(), run_len_.data(), runs_.data(),
                                                    static_cast<int>(n), stream_));
    bytes = 0;
    STRATA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, bytes, run_len_.data(), run_start_.data(),
                                               static_cast<int>(n), stream_));
    temp(bytes);
    STRATA_CHECK(cub::DeviceScan::ExclusiveSum(temp_.data(), bytes, run_len_.data(),
                                               run_start_.data(), static_cast<int>(n), stream_));
    const std::size_t threads = n * 32;
    detail::sum_and_apply_kernel<O><<<blocks_for(threads), 256, 0, stream_>>>(
        opt, unique_.data(), run_start_.data(), run_len_.data(), runs_.data(), sorted_pos_.data(),
        grads, dim, weights, state, O::state_floats(dim), keep_summed ? summed_.data() : nullptr);
    check_launch("sum_and_apply_kernel", stream_);
    dim_ = dim;
    unique_count_ = keep_summed ? download_runs() : -1;
  }

  /// Unique keys of the last call made with keep_summed (ascending; device), their count, and
  /// their summed gradient rows (unique_count × dim; device).
  [[nodiscard]] const std::uint64_t* unique_keys() const noexcept { return unique_.data(); }
  [[nodiscard]] const float* summed_grads() const noexcept { return summed_.data(); }
  [[nodiscard]] int unique_count() const noexcept { return unique_count_; }

 private:
  void reserve(std::size_t n, std::size_t dim, bool keep_summed) {
    if (positions_.size() < n) {
      positions_ = device_buffer<std::uint32_t>(n, stream_);
      sorted_pos_ = device_buffer<std::uint32_t>(n, stream_);
      sorted_keys_ = device_buffer<std::uint64_t>(n, stream_);
      unique_ = device_buffer<std::uint64_t>(n, stream_);
      run_len_ = device_buffer<std::uint32_t>(n, stream_);
      run_start_ = device_buffer<std::uint32_t>(n, stream_);
    }
    if (runs_.size() == 0) runs_ = device_buffer<int>(1, stream_);
    if (keep_summed) summed_.reserve(n * dim);
  }
  void temp(std::size_t bytes) { temp_.reserve(bytes == 0 ? 1 : bytes); }
  int download_runs() {
    int runs = 0;
    STRATA_CHECK(
        cudaMemcpyAsync(&runs, runs_.data(), sizeof(int), cudaMemcpyDeviceToHost, stream_));
    STRATA_CHECK(cudaStreamSynchronize(stream_));
    return runs;
  }

  cudaStream_t stream_;
  device_buffer<std::uint32_t> positions_, sorted_pos_, run_len_, run_start_;
  device_buffer<std::uint64_t> sorted_keys_, unique_;
  device_buffer<int> runs_;
  device_buffer<float> summed_;
  device_buffer<std::byte> temp_;
  std::size_t dim_ = 0;
  int unique_count_ = 0;
};

/// Device-resident embedding tables (the GPU twin of strata::embedding::local): table t is a
/// rows × dim float array plus rows × Optimizer::state_floats(dim) state, initialised with the
/// same `uniform_init` values of (seed, t, key) as the CPU table (computed on the host, uploaded
/// once). Calls take device pointers and run on the table set's stream:
/// - `pooled_forward(t, keys, offsets, bags, mode, out)`: out ← pooled rows (as
///   embedding::pooled_lookup::forward);
/// - `apply_gradients(t, keys, grads, n)`: duplicates summed in input order, optimizer applied
///   once per unique key (as embedding::local::apply_gradients), deterministic;
/// - `pooled_backward(t, keys, offsets, bags, mode, d_out)`: unpool + apply_gradients.
/// Keys must be < rows: `pooled_forward` flags bad keys and `check_keys()` throws (naming the
/// table) after waiting for the stream; `apply_gradients` on unchecked keys is undefined.
/// Not thread-safe.
template <class Optimizer>
requires detail::device_optimizer<Optimizer>
class local {
 public:
  local(std::vector<embedding::table_spec> specs, cudaStream_t stream, Optimizer optimizer = {},
        embedding::uniform_init init = {})
      : stream_(stream),
        optimizer_(optimizer),
        update_(stream),
        bad_(specs.size(), stream),
        grads_(0, stream) {
    for (std::size_t t = 0; t < specs.size(); ++t) {
      const auto& spec = specs[t];
      STRATA_EXPECTS(spec.rows > 0 && spec.dim > 0, "cuda::local: table ", t, " '", spec.name,
                     "' needs rows > 0 and dim > 0");
      std::vector<float> host(spec.rows * spec.dim);
      for (std::uint64_t k = 0; k < spec.rows; ++k)
        init.fill(t, k, {host.data() + k * spec.dim, spec.dim});
      table tab{spec, device_buffer<float>(std::span<const float>(host), stream),
                device_buffer<float>(spec.rows * Optimizer::state_floats(spec.dim), stream)};
      tab.state.fill_bytes(0);
      tables_.push_back(std::move(tab));
    }
    bad_.fill_bytes(0);
  }

  [[nodiscard]] std::size_t table_count() const noexcept { return tables_.size(); }
  [[nodiscard]] const embedding::table_spec& spec(std::size_t t) const { return checked(t).spec; }
  /// Device weights of table t (rows × dim).
  [[nodiscard]] device_matrix<float> weights(std::size_t t) {
    table& tab = checked(t);
    return {tab.weights.data(), tab.spec.rows, tab.spec.dim};
  }
  /// Host copies of table t's weights and state (wait for the stream).
  [[nodiscard]] std::vector<float> download_weights(std::size_t t) const {
    return checked(t).weights.download();
  }
  [[nodiscard]] std::vector<float> download_state(std::size_t t) const {
    return checked(t).state.download();
  }

  void pooled_forward(std::size_t t, const std::uint64_t* keys, const std::uint64_t* offsets,
                      std::size_t bags, pooling mode, float* out) {
    table& tab = checked(t);
    pooled_gather({tab.weights.data(), tab.spec.rows, tab.spec.dim}, keys, offsets, bags, mode, out,
                  bad_.data() + t, stream_);
  }

  /// Waits for the stream; throws errc::out_of_range, naming the first table concerned, when a
  /// pooled_forward since the last check met a key ≥ rows (each table has its own flag).
  void check_keys() {
    const std::vector<int> flags = bad_.download();
    const auto bad = std::find_if(flags.begin(), flags.end(), [](int f) { return f != 0; });
    if (bad == flags.end()) return;
    bad_.fill_bytes(0);
    const auto t = static_cast<std::size_t>(bad - flags.begin());
    fail(errc::out_of_range,
         cat("cuda::local: a key >= rows (", tables_[t].spec.rows, ") of table ", t, " '",
             tables_[t].spec.name,
             "' reached pooled_forward; its bag was set to NaN. Keys must be row indices"));
  }

  void apply_gradients(std::size_t t, const std::uint64_t* keys, const float* grads,
                       std::size_t n) {
    table& tab = checked(t);
    update_.apply(optimizer_, keys, grads, n, tab.spec.dim, tab.spec.rows, tab.weights.data(),
                  tab.state.data());
  }

  void pooled_backward(std::size_t t, const std::uint64_t* keys, std::size_t key_count,
                       const std::uint64_t* offsets, std::size_t bags, pooling mode,
                       const float* d_out) {
    table& tab = checked(t);
    grads_.reserve(key_count * tab.spec.dim);
    unpool(d_out, offsets, bags, tab.spec.dim, key_count, mode, grads_.data(), stream_);
    apply_gradients(t, keys, grads_.data(), key_count);
  }

 private:
  struct table {
    embedding::table_spec spec;
    device_buffer<float> weights;
    device_buffer<float> state;
  };
  table& checked(std::size_t t) {
    STRATA_EXPECTS(t < tables_.size(), "cuda::local: table ", t, " does not exist (there are ",
                   tables_.size(), ")");
    return tables_[t];
  }
  const table& checked(std::size_t t) const { return const_cast<local&>(*this).checked(t); }

  cudaStream_t stream_;
  Optimizer optimizer_;
  sparse_update update_;
  device_buffer<int> bad_;
  device_buffer<float> grads_;
  std::vector<table> tables_;
};

}  // namespace strata::cuda

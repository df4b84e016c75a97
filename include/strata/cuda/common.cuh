/// @file common.cuh
/// CUDA basics for strata: one overloaded `check` for CUDA runtime, cuBLAS and NCCL results
/// (throwing `strata::error` with the call text and file:line), checked kernel launches with an
/// optional synchronise-after-every-launch debug switch, a stream RAII type and stream-ordered
/// device buffers (cudaMallocAsync / cudaFreeAsync), pinned host buffers and events.
#pragma once

#if !defined(__CUDACC__)
#error \
    "strata/cuda/*.cuh are CUDA headers: include them only from .cu files compiled by nvcc (link strata::cuda)."
#endif

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <source_location>
#include <span>
#include <utility>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "strata/core/error.hpp"

namespace strata::cuda {

namespace detail {
[[noreturn]] inline void check_failed(const char* kind, int code, const char* what,
                                      const char* call, std::source_location where) {
  throw error(errc::internal,
              cat(kind, " error ", code, " (", what, ") in `", call, "` at ", where.file_name(),
                  ":", where.line(), "; check the device, the sizes passed and earlier launches"));
}

inline const char* cublas_text(cublasStatus_t s) noexcept {
  switch (s) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "unknown cuBLAS status";
  }
}
}  // namespace detail

/// Throws `strata::error` (errc::internal) naming the call and file:line unless `e` is
/// cudaSuccess. Clears CUDA's non-sticky last error first so later checks start clean.
inline void check(cudaError_t e, const char* call = "CUDA call",
                  std::source_location where = std::source_location::current()) {
  if (e == cudaSuccess) [[likely]]
    return;
  (void)cudaGetLastError();
  detail::check_failed("CUDA", static_cast<int>(e), cudaGetErrorString(e), call, where);
}

/// Throws unless `s` is CUBLAS_STATUS_SUCCESS.
inline void check(cublasStatus_t s, const char* call = "cuBLAS call",
                  std::source_location where = std::source_location::current()) {
  if (s == CUBLAS_STATUS_SUCCESS) [[likely]]
    return;
  detail::check_failed("cuBLAS", static_cast<int>(s), detail::cublas_text(s), call, where);
}

/// Checks a call and records its source text: `STRATA_CHECK(cudaMemset(p, 0, n));`. Works for
/// every overload of `check` (cudaError_t, cublasStatus_t, ncclResult_t with strata/cuda/nccl.cuh).
#define STRATA_CHECK(call) ::strata::cuda::check((call), #call)

/// Whether launches synchronise and check immediately (debug aid: a failing kernel is then
/// reported at its own launch). Starts from the environment variable STRATA_CUDA_SYNC=1;
/// `set_sync_after_launch` overrides it. Not thread-safe to change while launching.
inline bool& sync_after_launch() {
  static bool on = [] {
    const char* v = std::getenv("STRATA_CUDA_SYNC");
    return v != nullptr && v[0] == '1';
  }();
  return on;
}
inline void set_sync_after_launch(bool on) {
  sync_after_launch() = on;
}

/// Checks the launch just made on `stream` (cudaGetLastError) and, in sync mode, waits for it
/// and checks its execution. `kernel` names the kernel in the error message.
inline void check_launch(const char* kernel, cudaStream_t stream,
                         std::source_location where = std::source_location::current()) {
  check(cudaGetLastError(), kernel, where);
  if (sync_after_launch()) check(cudaStreamSynchronize(stream), kernel, where);
}

/// Number of visible CUDA devices; 0 (never an exception) when there is no device or driver.
inline int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

/// Blocks of `threads` covering n items (at least 1, capped to CUDA's grid limit).
inline unsigned blocks_for(std::size_t n, unsigned threads = 256) {
  const std::size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b == 0 ? 1 : (b > 0x7fffffffu ? 0x7fffffffu : b));
}

/// Grid size for grid-stride kernels over n items: blocks_for(n) capped at 2^20 blocks.
inline unsigned grid_for(std::size_t n, unsigned threads = 256) {
  const unsigned b = blocks_for(n, threads);
  return b < (1u << 20) ? b : (1u << 20);
}

/// Owns a non-blocking CUDA stream. Move-only; destroying it does not wait for queued work
/// (cudaStreamDestroy releases the stream once that work is done).
class stream {
 public:
  stream() { STRATA_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking)); }
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  stream(stream&& o) noexcept : s_(std::exchange(o.s_, nullptr)) {}
  stream& operator=(stream&& o) noexcept {
    if (this != &o) {
      reset();
      s_ = std::exchange(o.s_, nullptr);
    }
    return *this;
  }
  ~stream() { reset(); }

  [[nodiscard]] cudaStream_t get() const noexcept { return s_; }
  operator cudaStream_t() const noexcept { return s_; }  // NOLINT(google-explicit-constructor)
  /// Waits for everything queued on the stream; throws on an asynchronous error.
  void synchronize() const { STRATA_CHECK(cudaStreamSynchronize(s_)); }

 private:
  void reset() noexcept {
    if (s_ != nullptr) (void)cudaStreamDestroy(s_);
    s_ = nullptr;
  }
  cudaStream_t s_ = nullptr;
};

/// A device array of n T allocated and freed in stream order (cudaMallocAsync/cudaFreeAsync on
/// the stream given at construction). Contents are uninitialised. Move-only; not thread-safe.
/// Use it only on its stream (or synchronise first). Host copies are synchronous helpers.
template <class T>
class device_buffer {
 public:
  device_buffer() = default;
  device_buffer(std::size_t n, cudaStream_t s) : size_(n), stream_(s) {
    if (n > 0)
      STRATA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&data_), n * sizeof(T), stream_));
  }
  device_buffer(std::span<const T> host, cudaStream_t s) : device_buffer(host.size(), s) {
    upload(host);
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer(device_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)),
        size_(std::exchange(o.size_, 0)),
        stream_(o.stream_) {}
  device_buffer& operator=(device_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      stream_ = o.stream_;
    }
    return *this;
  }
  ~device_buffer() { release(); }

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::size_t bytes() const noexcept { return size_ * sizeof(T); }
  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }
  [[nodiscard]] std::span<T> span() const noexcept { return {data_, size_}; }

  /// Grows to at least n elements (contents are not kept when it reallocates).
  void reserve(std::size_t n) {
    if (n > size_) *this = device_buffer(n, stream_);
  }
  /// Copies host values into the first host.size() elements and waits.
  void upload(std::span<const T> host) {
    STRATA_EXPECTS(host.size() <= size_, "device_buffer::upload: ", host.size(),
                   " values do not fit in a buffer of ", size_);
    if (host.empty()) return;
    STRATA_CHECK(
        cudaMemcpyAsync(data_, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream_));
    STRATA_CHECK(cudaStreamSynchronize(stream_));
  }
  /// Copies the whole buffer to a new host vector (waits for the stream).
  [[nodiscard]] std::vector<T> download() const {
    std::vector<T> host(size_);
    if (size_ == 0) return host;
    STRATA_CHECK(cudaMemcpyAsync(host.data(), data_, bytes(), cudaMemcpyDeviceToHost, stream_));
    STRATA_CHECK(cudaStreamSynchronize(stream_));
    return host;
  }
  /// Sets every byte to `byte` (stream-ordered, no wait); 0xff makes floats NaN (poison).
  void fill_bytes(int byte) {
    if (size_ > 0) STRATA_CHECK(cudaMemsetAsync(data_, byte, bytes(), stream_));
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) (void)cudaFreeAsync(data_, stream_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  cudaStream_t stream_ = nullptr;
};

/// A page-locked (pinned) host array of n T (cudaMallocHost / cudaFreeHost): the staging area
/// for asynchronous host↔device copies, which only overlap with kernels from pinned memory.
/// Contents are uninitialised. Move-only; grows with `reserve` (contents not kept).
template <class T>
class pinned_buffer {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(std::size_t n) : size_(n) {
    if (n > 0) STRATA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&data_), n * sizeof(T)));
  }
  pinned_buffer(const pinned_buffer&) = delete;
  pinned_buffer& operator=(const pinned_buffer&) = delete;
  pinned_buffer(pinned_buffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  pinned_buffer& operator=(pinned_buffer&& o) noexcept {
    if (this != &o) {
      release();
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
    }
    return *this;
  }
  ~pinned_buffer() { release(); }

  [[nodiscard]] T* data() const noexcept { return data_; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] std::span<T> span() const noexcept { return {data_, size_}; }
  /// Grows to at least n elements (contents are not kept when it reallocates). Callers must
  /// not have copies in flight from or to the old array.
  void reserve(std::size_t n) {
    if (n > size_) *this = pinned_buffer(n);
  }

 private:
  void release() noexcept {
    if (data_ != nullptr) (void)cudaFreeHost(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Owns a CUDA event without timing (cudaEventDisableTiming): `record` on one stream, then
/// `wait_on` another stream (cross-stream ordering without blocking the host) or `synchronize`.
class event {
 public:
  event() { STRATA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
  event& operator=(event&&) = delete;
  ~event() {
    if (e_ != nullptr) (void)cudaEventDestroy(e_);
  }
  [[nodiscard]] cudaEvent_t get() const noexcept { return e_; }
  void record(cudaStream_t s) { STRATA_CHECK(cudaEventRecord(e_, s)); }
  /// Work queued on `s` after this call starts only once the recorded work is done.
  void wait_on(cudaStream_t s) const { STRATA_CHECK(cudaStreamWaitEvent(s, e_, 0)); }
  void synchronize() const { STRATA_CHECK(cudaEventSynchronize(e_)); }

 private:
  cudaEvent_t e_ = nullptr;
};

}  // namespace strata::cuda

/// @file dlrm_impl.cuh
/// The device half of `cuda::dlrm` (strata/cuda/dlrm.hpp): include this file from exactly one
/// .cu file of a program (compiled by nvcc, linked with strata::cuda). It defines the model's
/// device state and its forward / backward.
#pragma once

#if !defined(__CUDACC__)
#error \
    "strata/cuda/*.cuh are CUDA headers: include them only from .cu files compiled by nvcc (link strata::cuda)."
#endif

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/cuda/common.cuh"
#include "strata/cuda/dense.cuh"
#include "strata/cuda/dlrm.hpp"

namespace strata::cuda {

namespace detail {
/// A host range page-locked in place with cudaHostRegister, unregistered by the destructor.
/// Empty (false) when the driver refused (e.g. a page already registered by another buffer):
/// the caller then stages through pinned memory instead.
class host_registration {
 public:
  host_registration() = default;
  explicit host_registration(std::span<float> host) noexcept {
    if (host.empty()) return;
    if (cudaHostRegister(host.data(), host.size_bytes(), cudaHostRegisterDefault) == cudaSuccess)
      data_ = host.data();
    else
      (void)cudaGetLastError();  // not sticky: clear it so later checks start clean
  }
  host_registration(const host_registration&) = delete;
  host_registration& operator=(const host_registration&) = delete;
  ~host_registration() {
    if (data_ != nullptr) (void)cudaHostUnregister(data_);
  }
  explicit operator bool() const noexcept { return data_ != nullptr; }

 private:
  float* data_ = nullptr;
};

/// Waits for both streams of a model when a step throws half-way, so the next step never
/// refills pinned staging memory that a copy queued before the error is still reading.
class quiesce_on_error {
 public:
  quiesce_on_error(cudaStream_t a, cudaStream_t b) noexcept
      : a_(a), b_(b), exceptions_(std::uncaught_exceptions()) {}
  quiesce_on_error(const quiesce_on_error&) = delete;
  quiesce_on_error& operator=(const quiesce_on_error&) = delete;
  ~quiesce_on_error() {
    if (std::uncaught_exceptions() > exceptions_) {
      (void)cudaStreamSynchronize(a_);
      (void)cudaStreamSynchronize(b_);
    }
  }

 private:
  cudaStream_t a_, b_;
  int exceptions_;
};
}  // namespace detail

/// Streams, cuBLAS handle and buffers of one `cuda::dlrm`. Batch-sized buffers grow to the
/// largest batch seen (allocation, then a synchronisation so every stream may use them).
struct dlrm::device_state {
  device_state(int device_index, std::span<float> host_params, std::span<float> host_grads)
      : device(device_index),
        handle(compute),
        params(host_params),
        grads(host_grads),
        // Page-lock the host parameter and gradient buffers in place, so their copies are
        // asynchronous DMA with no staging copy. When the driver refuses (e.g. a page already
        // registered by another model's buffer), fall back to pinned staging buffers. RAII: a
        // later allocation failure unregisters them again.
        params_registration(host_params),
        grads_registration(host_grads),
        params_registered(static_cast<bool>(params_registration)),
        grads_registered(static_cast<bool>(grads_registration)) {
    if (!params_registered) params_stage = pinned_buffer<float>(params.size());
    if (!grads_registered) grads_stage = pinned_buffer<float>(grads.size());
    device_params = device_buffer<float>(params.size(), compute);
    device_grads = device_buffer<float>(grads.size(), compute);
  }
  device_state(const device_state&) = delete;
  device_state& operator=(const device_state&) = delete;
  ~device_state() {
    // Nothing may still be copying from or into the host buffers (the registrations and
    // pinned buffers are released after this body).
    (void)cudaStreamSynchronize(copy);
    (void)cudaStreamSynchronize(compute);
  }
  /// Host parameters → device (stream-ordered on the compute stream).
  void upload_params() {
    const float* from = params.data();
    if (!params_registered) {
      std::copy(params.begin(), params.end(), params_stage.data());
      from = params_stage.data();
    }
    STRATA_CHECK(cudaMemcpyAsync(device_params.data(), from, params.size_bytes(),
                                 cudaMemcpyHostToDevice, compute));
  }
  /// Device gradients → host; call `finish_grads` after the compute stream was synchronised.
  void download_grads() {
    float* to = grads_registered ? grads.data() : grads_stage.data();
    STRATA_CHECK(cudaMemcpyAsync(to, device_grads.data(), grads.size_bytes(),
                                 cudaMemcpyDeviceToHost, compute));
  }
  void finish_grads() {
    if (!grads_registered) std::copy_n(grads_stage.data(), grads.size(), grads.begin());
  }

  /// Buffers for `batch` samples; embedding pointer tables for exactly this batch.
  void ensure(const dlrm& m, std::size_t batch) {
    const auto& c = m.config_;
    const std::size_t features = c.sparse_features, dim = c.embedding_dim;
    if (batch > capacity) {
      dense_in = device_buffer<float>(batch * c.dense_features, compute);
      embedded = device_buffer<float>(features * batch * dim, compute);
      embedded_grads = device_buffer<float>(features * batch * dim, compute);
      x = device_buffer<float>(batch * m.interaction_cols(), compute);
      dx = device_buffer<float>(batch * m.interaction_cols(), compute);
      dz = device_buffer<float>(batch * dim, compute);
      dlogits = device_buffer<float>(batch, compute);
      auto per_layer = [&](const std::vector<layer>& layers, std::vector<device_buffer<float>>& v) {
        v.clear();
        for (const auto& l : layers)
          v.emplace_back(batch * l.out, compute);
      };
      per_layer(m.bottom_, bottom_acts);
      per_layer(m.bottom_, bottom_deltas);
      per_layer(m.top_, top_acts);
      per_layer(m.top_, top_deltas);
      stage_in = pinned_buffer<float>(batch * c.dense_features + features * batch * dim);
      stage_out = pinned_buffer<float>(features * batch * dim);
      stage_small = pinned_buffer<float>(batch);
      capacity = batch;
      pointers_batch = 0;
      STRATA_CHECK(cudaStreamSynchronize(compute));  // allocations visible to the copy stream
    }
    if (pointers_batch != batch) {
      std::vector<const float*> in_ptrs(features);
      std::vector<float*> grad_ptrs(features);
      for (std::size_t f = 0; f < features; ++f) {
        in_ptrs[f] = embedded.data() + f * batch * dim;
        grad_ptrs[f] = embedded_grads.data() + f * batch * dim;
      }
      embedded_ptrs = device_buffer<const float*>(std::span<const float* const>(in_ptrs), compute);
      embedded_grad_ptrs = device_buffer<float*>(std::span<float* const>(grad_ptrs), compute);
      pointers_batch = batch;
    }
  }

  int device;
  stream compute, copy;
  blas handle;
  event embedded_ready, embedded_grads_ready;
  std::span<float> params, grads;
  detail::host_registration params_registration, grads_registration;
  bool params_registered = false, grads_registered = false;
  device_buffer<float> device_params, device_grads;
  device_buffer<float> dense_in, embedded, embedded_grads, x, dx, dz, dlogits;
  std::vector<device_buffer<float>> bottom_acts, bottom_deltas, top_acts, top_deltas;
  device_buffer<const float*> embedded_ptrs;
  device_buffer<float*> embedded_grad_ptrs;
  pinned_buffer<float> stage_in, stage_out, stage_small;
  pinned_buffer<float> params_stage, grads_stage;  ///< only when registration was refused
  std::size_t capacity = 0, pointers_batch = 0;
};

namespace detail {
/// Copies a (possibly strided) host matrix into contiguous memory at `out`; returns the end.
inline float* pack_rows(matrix_view<const float> m, float* out) {
  if (m.contiguous()) {
    std::memcpy(out, m.data(), m.rows() * m.cols() * sizeof(float));
    return out + m.rows() * m.cols();
  }
  for (std::size_t r = 0; r < m.rows(); ++r, out += m.cols())
    std::memcpy(out, m.row(r).data(), m.cols() * sizeof(float));
  return out;
}
/// Copies contiguous values at `in` into a (possibly strided) host matrix; returns the end.
inline const float* unpack_rows(const float* in, matrix_view<float> m) {
  for (std::size_t r = 0; r < m.rows(); ++r, in += m.cols())
    std::memcpy(m.row(r).data(), in, m.cols() * sizeof(float));
  return in;
}
/// Makes `device` current for this thread, with a clear error when it does not exist.
inline void use_device(int device) {
  const int count = device_count();
  if (count == 0)
    fail(errc::invalid_argument,
         "cuda::dlrm: no CUDA device found (cudaGetDeviceCount reports none); a GPU worker needs "
         "a GPU — train with models::dlrm on the CPU instead");
  if (device >= count)
    fail(errc::invalid_argument, cat("cuda::dlrm: config::device = ", device, " but only ", count,
                                     " CUDA device(s) are visible; choose a device in [0, ", count,
                                     ") (check CUDA_VISIBLE_DEVICES)"));
  STRATA_CHECK(cudaSetDevice(device));
}
}  // namespace detail

dlrm::device_state& dlrm::device() {
  detail::use_device(config_.device);
  if (!state_) {
    auto fresh = std::make_unique<device_state>(config_.device, params_.values(), params_.grads());
    state_ = std::unique_ptr<device_state, state_deleter>(
        fresh.release(), [](device_state* s) noexcept { std::default_delete<device_state>{}(s); });
  }
  return *state_;
}

void dlrm::forward(const models::ctr_inputs& in, std::span<float> logits) {
  models::detail::check_inputs("cuda::dlrm", tables_, config_.dense_features, in);
  const std::size_t batch = in.dense.rows();
  if (logits.size() != batch)
    fail(errc::size_mismatch, cat("cuda::dlrm::forward: logits size is ", logits.size(),
                                  " but the batch has ", batch, " samples"));
  auto& s = device();
  forwarded_ = false;
  batch_ = batch;
  if (batch == 0) {
    forwarded_ = true;
    return;
  }
  s.ensure(*this, batch);
  const detail::quiesce_on_error quiesce(s.compute, s.copy);
  const std::size_t features = config_.sparse_features, dim = config_.embedding_dim;
  const std::size_t dense_values = batch * config_.dense_features;

  // Stage the batch in pinned memory: dense features, then table after table.
  float* at = detail::pack_rows(in.dense, s.stage_in.data());
  for (const auto& e : in.embedded)
    at = detail::pack_rows(e, at);

  // Compute stream: parameters + dense features up, then the bottom MLP; meanwhile the copy
  // stream brings the embedding rows.
  s.upload_params();
  STRATA_CHECK(cudaMemcpyAsync(s.dense_in.data(), s.stage_in.data(), dense_values * sizeof(float),
                               cudaMemcpyHostToDevice, s.compute));
  STRATA_CHECK(cudaMemcpyAsync(s.embedded.data(), s.stage_in.data() + dense_values,
                               features * batch * dim * sizeof(float), cudaMemcpyHostToDevice,
                               s.copy));
  s.embedded_ready.record(s.copy);

  const float* p = s.device_params.data();
  const float* current = s.dense_in.data();
  for (std::size_t l = 0; l < bottom_.size(); ++l) {
    const auto& L = bottom_[l];
    linear::forward(s.handle, current, p + L.weight_offset, p + L.bias_offset,
                    s.bottom_acts[l].data(), batch, L.in, L.out, true, s.compute);
    current = s.bottom_acts[l].data();
  }
  s.embedded_ready.wait_on(s.compute);
  interaction::forward(current, s.embedded_ptrs.data(), batch, features, dim, s.x.data(),
                       s.compute);
  current = s.x.data();
  for (std::size_t l = 0; l < top_.size(); ++l) {
    const auto& L = top_[l];
    linear::forward(s.handle, current, p + L.weight_offset, p + L.bias_offset, s.top_acts[l].data(),
                    batch, L.in, L.out, l + 1 < top_.size(), s.compute);
    current = s.top_acts[l].data();
  }
  STRATA_CHECK(cudaMemcpyAsync(s.stage_small.data(), current, batch * sizeof(float),
                               cudaMemcpyDeviceToHost, s.compute));
  s.compute.synchronize();
  std::copy_n(s.stage_small.data(), batch, logits.begin());
  forwarded_ = true;
}

void dlrm::backward(std::span<const float> dlogits,
                    std::span<const matrix_view<float>> embedded_grads) {
  if (!forwarded_)
    fail(errc::invalid_argument, "cuda::dlrm::backward called before forward; run forward first");
  if (dlogits.size() != batch_)
    fail(errc::size_mismatch, cat("cuda::dlrm::backward: dlogits size is ", dlogits.size(),
                                  " but the last forward had ", batch_, " samples"));
  models::detail::check_embedding_grads("cuda::dlrm", tables_, batch_, embedded_grads);
  const std::size_t batch = batch_;
  if (batch == 0) {
    std::fill(params_.grads().begin(), params_.grads().end(), 0.0f);
    return;
  }
  auto& s = device();
  const detail::quiesce_on_error quiesce(s.compute, s.copy);
  const std::size_t features = config_.sparse_features, dim = config_.embedding_dim;
  const float* p = s.device_params.data();
  float* g = s.device_grads.data();

  std::copy(dlogits.begin(), dlogits.end(), s.stage_small.data());
  STRATA_CHECK(cudaMemcpyAsync(s.dlogits.data(), s.stage_small.data(), batch * sizeof(float),
                               cudaMemcpyHostToDevice, s.compute));
  // Top MLP (no ReLU on its output), down to dL/dx of the interaction's output.
  const float* delta = s.dlogits.data();
  for (std::size_t l = top_.size(); l-- > 0;) {
    const auto& L = top_[l];
    const bool first = l == 0;
    const float* x = first ? s.x.data() : s.top_acts[l - 1].data();
    float* dx = first ? s.dx.data() : s.top_deltas[l - 1].data();
    linear::backward(s.handle, x, p + L.weight_offset, delta, g + L.weight_offset,
                     g + L.bias_offset, dx, batch, L.in, L.out, !first, s.compute);
    delta = dx;
  }
  const std::size_t last = bottom_.size() - 1;
  interaction::backward(s.bottom_acts[last].data(), s.embedded_ptrs.data(), batch, features, dim,
                        s.dx.data(), s.dz.data(), s.embedded_grad_ptrs.data(), s.compute);
  // Embedding gradients go down on the copy stream while the bottom MLP's backward runs.
  s.embedded_grads_ready.record(s.compute);
  s.embedded_grads_ready.wait_on(s.copy);
  STRATA_CHECK(cudaMemcpyAsync(s.stage_out.data(), s.embedded_grads.data(),
                               features * batch * dim * sizeof(float), cudaMemcpyDeviceToHost,
                               s.copy));
  // Bottom MLP: ReLU after its last layer too.
  relu::backward(s.bottom_acts[last].data(), s.dz.data(), s.bottom_deltas[last].data(),
                 batch * bottom_[last].out, s.compute);
  delta = s.bottom_deltas[last].data();
  for (std::size_t l = bottom_.size(); l-- > 0;) {
    const auto& L = bottom_[l];
    if (l == 0) {
      linear::backward(s.handle, s.dense_in.data(), p + L.weight_offset, delta, g + L.weight_offset,
                       g + L.bias_offset, nullptr, batch, L.in, L.out, false, s.compute);
    } else {
      float* dx = s.bottom_deltas[l - 1].data();
      linear::backward(s.handle, s.bottom_acts[l - 1].data(), p + L.weight_offset, delta,
                       g + L.weight_offset, g + L.bias_offset, dx, batch, L.in, L.out, true,
                       s.compute);
      delta = dx;
    }
  }
  s.download_grads();
  s.copy.synchronize();
  const float* at = s.stage_out.data();
  for (const auto& view : embedded_grads)
    at = detail::unpack_rows(at, view);
  s.compute.synchronize();
  s.finish_grads();
}

}  // namespace strata::cuda

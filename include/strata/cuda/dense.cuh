/// @file dense.cuh
/// Dense layers on the device: linear forward/backward through cuBLAS SGEMM (row-major via the
/// transposition trick), ReLU / sigmoid, binary cross-entropy with logits, and DLRM's pairwise
/// dot interaction (forward + backward), each the twin of the strata::nn layer of that name.
#pragma once

#if !defined(__CUDACC__)
#error \
    "strata/cuda/*.cuh are CUDA headers: include them only from .cu files compiled by nvcc (link strata::cuda)."
#endif

#include <cstddef>
#include <utility>

#include <cub/device/device_reduce.cuh>

#include "strata/cuda/common.cuh"

namespace strata::cuda {

/// Owns a cuBLAS handle bound to a stream (default math: full fp32, no TF32). Move-only; one
/// handle per thread.
class blas {
 public:
  explicit blas(cudaStream_t stream) {
    STRATA_CHECK(cublasCreate(&h_));
    STRATA_CHECK(cublasSetStream(h_, stream));
  }
  blas(const blas&) = delete;
  blas& operator=(const blas&) = delete;
  blas(blas&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  blas& operator=(blas&&) = delete;
  ~blas() {
    if (h_ != nullptr) (void)cublasDestroy(h_);
  }
  [[nodiscard]] cublasHandle_t get() const noexcept { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

namespace detail {

// Every kernel here is a template (the plain ones `template <int = 0>`, launched as f<<<…>>>)
// so that it has vague linkage: several .cu files of one program may include this header
// without duplicate kernel symbols at link time.
/// max(v, 0) with std::max's (and the CPU's Eigen cwiseMax's) rules: NaN stays NaN (a
/// diverging run shows on the GPU too) and −0 stays −0 — fmaxf would turn both into +0.
__device__ inline float relu_value(float v) {
  return v < 0.0f ? 0.0f : v;
}
template <int = 0>
__global__ void bias_act_kernel(float* y, const float* b, std::size_t rows, std::size_t cols,
                                bool relu) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < rows * cols;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float v = __fadd_rn(y[i], b[i % cols]);
    y[i] = relu ? relu_value(v) : v;
  }
}
/// db[c] = Σ_r dy[r][c] in row order (deterministic).
template <int = 0>
__global__ void column_sum_kernel(const float* dy, std::size_t rows, std::size_t cols, float* db) {
  for (std::size_t c = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; c < cols;
       c += std::size_t{gridDim.x} * blockDim.x) {
    float s = 0.0f;
    for (std::size_t r = 0; r < rows; ++r)
      s = __fadd_rn(s, dy[r * cols + c]);
    db[c] = s;
  }
}
template <int = 0>
__global__ void relu_mask_kernel(float* dx, const float* x, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    dx[i] = x[i] > 0.0f ? dx[i] : 0.0f;
}
template <int = 0>
__global__ void relu_kernel(const float* x, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    y[i] = relu_value(x[i]);
}
template <int = 0>
__global__ void relu_backward_kernel(const float* y, const float* dy, float* dx, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}
__device__ inline float sigmoid_value(float x) {
  const float e = expf(-fabsf(x));
  return x >= 0.0f ? __fdiv_rn(1.0f, __fadd_rn(1.0f, e)) : __fdiv_rn(e, __fadd_rn(1.0f, e));
}
template <int = 0>
__global__ void sigmoid_kernel(const float* x, float* y, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    y[i] = sigmoid_value(x[i]);
}
template <int = 0>
__global__ void sigmoid_backward_kernel(const float* y, const float* dy, float* dx, std::size_t n) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    dx[i] = __fmul_rn(__fmul_rn(dy[i], y[i]), __fsub_rn(1.0f, y[i]));
}
template <int = 0>
__global__ void bce_kernel(const float* logits, const float* labels, std::size_t n, float scale,
                           double* losses, float* dlogits) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const double l = logits[i], y = labels[i];
    losses[i] = fmax(l, 0.0) - l * y + log1p(exp(-fabs(l)));
    if (dlogits != nullptr)
      dlogits[i] = __fmul_rn(__fsub_rn(sigmoid_value(logits[i]), labels[i]), scale);
  }
}
/// One thread per (sample, output column): copies z or computes one pairwise dot in order.
template <int = 0>
__global__ void interaction_forward_kernel(const float* z, const float* const* emb,
                                           std::size_t batch, std::size_t features, std::size_t dim,
                                           float* out) {
  const std::size_t pairs = (features + 1) * features / 2, cols = dim + pairs;
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < batch * cols;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = idx / cols, k = idx % cols;
    if (k < dim) {
      out[idx] = z[r * dim + k];
      continue;
    }
    std::size_t p = k - dim, i = 1;  // pair p = i(i-1)/2 + j
    while (i * (i + 1) / 2 <= p)
      ++i;
    const std::size_t j = p - i * (i - 1) / 2;
    const float* a = emb[i - 1] + r * dim;
    const float* b = j == 0 ? z + r * dim : emb[j - 1] + r * dim;
    float s = 0.0f;
    for (std::size_t c = 0; c < dim; ++c)
      s = __fadd_rn(s, __fmul_rn(a[c], b[c]));
    out[idx] = s;
  }
}
/// One thread per (sample, row i of T, column c): dT[i][c] = Σ_{j≠i} S[i][j]·T[j][c].
template <int = 0>
__global__ void interaction_backward_kernel(const float* z, const float* const* emb,
                                            std::size_t batch, std::size_t features,
                                            std::size_t dim, const float* dout, float* dz,
                                            float* const* demb) {
  const std::size_t n = features + 1, cols = dim + (features + 1) * features / 2;
  for (std::size_t idx = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; idx < batch * n * dim;
       idx += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = idx / (n * dim), i = (idx / dim) % n, c = idx % dim;
    const float* drow = dout + r * cols;
    float s = 0.0f;
    for (std::size_t j = 0; j < n; ++j) {
      if (j == i) continue;
      const std::size_t hi = i > j ? i : j, lo = i > j ? j : i;
      const float t = j == 0 ? z[r * dim + c] : emb[j - 1][r * dim + c];
      s = __fadd_rn(s, __fmul_rn(drow[dim + hi * (hi - 1) / 2 + lo], t));
    }
    if (i == 0)
      dz[r * dim + c] = __fadd_rn(drow[c], s);
    else
      demb[i - 1][r * dim + c] = s;
  }
}
}  // namespace detail

/// Fully connected layer on device memory, as strata::nn::linear: x (batch × in), W (out × in,
/// row-major), b (out), y (batch × out). Cost: one SGEMM forward, two backward. Deterministic
/// (cuBLAS default math, column sums in row order). Stateless; calls are stream-ordered.
struct linear {
  /// y ← act(x·Wᵀ + b) (act = ReLU when `relu`).
  static void forward(const blas& h, const float* x, const float* w, const float* b, float* y,
                      std::size_t batch, std::size_t in, std::size_t out, bool relu,
                      cudaStream_t stream) {
    const float one = 1.0f, zero = 0.0f;
    // Column-major view: yᵀ (out × batch) = W (op T of the in × out storage) · xᵀ.
    STRATA_CHECK(cublasSgemm(h.get(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(out),
                             static_cast<int>(batch), static_cast<int>(in), &one, w,
                             static_cast<int>(in), x, static_cast<int>(in), &zero, y,
                             static_cast<int>(out)));
    detail::bias_act_kernel<<<grid_for(batch * out), 256, 0, stream>>>(y, b, batch, out, relu);
    check_launch("bias_act_kernel", stream);
  }
  /// dW = dYᵀ·x, db = Σ_rows dY, and (when dx is not null) dx = dY·W, masked by x > 0 when
  /// `through_relu` (x is then a ReLU output), as nn::linear::backward.
  static void backward(const blas& h, const float* x, const float* w, const float* dy, float* dw,
                       float* db, float* dx, std::size_t batch, std::size_t in, std::size_t out,
                       bool through_relu, cudaStream_t stream) {
    const float one = 1.0f, zero = 0.0f;
    // dWᵀ (in × out) = xᵀ (in × batch) · dY (batch × out).
    STRATA_CHECK(cublasSgemm(h.get(), CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(in),
                             static_cast<int>(out), static_cast<int>(batch), &one, x,
                             static_cast<int>(in), dy, static_cast<int>(out), &zero, dw,
                             static_cast<int>(in)));
    detail::column_sum_kernel<<<grid_for(out), 256, 0, stream>>>(dy, batch, out, db);
    check_launch("column_sum_kernel", stream);
    if (dx == nullptr) return;
    // dxᵀ (in × batch) = Wᵀ (in × out) · dYᵀ (out × batch).
    STRATA_CHECK(cublasSgemm(h.get(), CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(in),
                             static_cast<int>(batch), static_cast<int>(out), &one, w,
                             static_cast<int>(in), dy, static_cast<int>(out), &zero, dx,
                             static_cast<int>(in)));
    if (through_relu) {
      detail::relu_mask_kernel<<<grid_for(batch * in), 256, 0, stream>>>(dx, x, batch * in);
      check_launch("relu_mask_kernel", stream);
    }
  }
};

/// ReLU y = max(x, 0); backward dx = dy ⊙ [y > 0] (as nn::relu). n values; may alias.
struct relu {
  static void forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
    detail::relu_kernel<<<grid_for(n), 256, 0, stream>>>(x, y, n);
    check_launch("relu_kernel", stream);
  }
  static void backward(const float* y, const float* dy, float* dx, std::size_t n,
                       cudaStream_t stream) {
    detail::relu_backward_kernel<<<grid_for(n), 256, 0, stream>>>(y, dy, dx, n);
    check_launch("relu_backward_kernel", stream);
  }
};

/// Stable logistic sigmoid and its backward dx = dy ⊙ y ⊙ (1 − y) (as nn::sigmoid).
struct sigmoid {
  static void forward(const float* x, float* y, std::size_t n, cudaStream_t stream) {
    detail::sigmoid_kernel<<<grid_for(n), 256, 0, stream>>>(x, y, n);
    check_launch("sigmoid_kernel", stream);
  }
  static void backward(const float* y, const float* dy, float* dx, std::size_t n,
                       cudaStream_t stream) {
    detail::sigmoid_backward_kernel<<<grid_for(n), 256, 0, stream>>>(y, dy, dx, n);
    check_launch("sigmoid_backward_kernel", stream);
  }
};

/// Binary cross-entropy with logits (as nn::bce_with_logits, reduction mean): per-sample losses
/// in double, summed by cub::DeviceReduce::Sum; dlogits[i] = (σ(l_i) − y_i)·grad_scale when
/// dlogits is not null. Returns the mean loss (waits for the stream). Workspace reused; not
/// thread-safe.
class bce_with_logits {
 public:
  explicit bce_with_logits(cudaStream_t stream) : stream_(stream) {}
  double operator()(const float* logits, const float* labels, std::size_t n, float* dlogits,
                    float grad_scale) {
    if (n == 0) return 0.0;
    losses_.reserve(n);
    sum_.reserve(1);
    detail::bce_kernel<<<grid_for(n), 256, 0, stream_>>>(logits, labels, n, grad_scale,
                                                         losses_.data(), dlogits);
    check_launch("bce_kernel", stream_);
    std::size_t bytes = 0;
    STRATA_CHECK(cub::DeviceReduce::Sum(nullptr, bytes, losses_.data(), sum_.data(),
                                        static_cast<int>(n), stream_));
    temp_.reserve(bytes == 0 ? 1 : bytes);
    STRATA_CHECK(cub::DeviceReduce::Sum(temp_.data(), bytes, losses_.data(), sum_.data(),
                                        static_cast<int>(n), stream_));
    return sum_.download()[0] / static_cast<double>(n);
  }

 private:
  cudaStream_t stream_;
  device_buffer<double> losses_{0, stream_}, sum_{0, stream_};
  device_buffer<std::byte> temp_{0, stream_};
};

/// DLRM dot interaction (as nn::interaction): z (batch × d) and F embedding batches (device
/// pointers to batch × d arrays, themselves in a device array `emb` of F pointers) →
/// out (batch × (d + (F+1)F/2)) = [z | strictly lower triangle of T·Tᵀ per sample]; backward
/// writes dz and every de_f. One thread per output value; sums in a fixed order
/// (deterministic). Cost: forward batch·(F+1)F/2·d multiply-adds, backward batch·(F+1)²·d.
struct interaction {
  static void forward(const float* z, const float* const* emb, std::size_t batch,
                      std::size_t features, std::size_t dim, float* out, cudaStream_t stream) {
    const std::size_t cols = dim + (features + 1) * features / 2;
    detail::interaction_forward_kernel<<<grid_for(batch * cols), 256, 0, stream>>>(
        z, emb, batch, features, dim, out);
    check_launch("interaction_forward_kernel", stream);
  }
  static void backward(const float* z, const float* const* emb, std::size_t batch,
                       std::size_t features, std::size_t dim, const float* dout, float* dz,
                       float* const* demb, cudaStream_t stream) {
    detail::interaction_backward_kernel<<<grid_for(batch * (features + 1) * dim), 256, 0, stream>>>(
        z, emb, batch, features, dim, dout, dz, demb);
    check_launch("interaction_backward_kernel", stream);
  }
};

}  // namespace strata::cuda

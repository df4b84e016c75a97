/// @file compress.cuh
/// Device codecs producing the same bytes as the CPU codecs of include/strata/compress/:
/// fp16 (binary16, round to nearest even), int8_block<B> (fp32 absmax scale + B int8 per block)
/// and topk (k largest magnitudes as (uint32 index, fp32 value) pairs, ascending index, ties to
/// the lower index). The CPU codec is the reference; the tests compare bytes.
#pragma once

#if !defined(__CUDACC__)
#error \
    "strata/cuda/*.cuh are CUDA headers: include them only from .cu files compiled by nvcc (link strata::cuda)."
#endif

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>

#include "strata/cuda/common.cuh"

namespace strata::cuda {

/// float → binary16 bits: the arithmetic of strata::compress::float_to_half, on host or device.
__host__ __device__ inline std::uint16_t float_to_half(float value) {
#ifdef __CUDA_ARCH__
  const std::uint32_t bits = __float_as_uint(value);
#else
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
#endif
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude >= 0x7f800000u)
    return static_cast<std::uint16_t>(
        (magnitude > 0x7f800000u ? 0x7e00u | ((magnitude >> 13) & 0x3ffu) : 0x7c00u) | sign);
  if (magnitude >= 0x477ff000u) return static_cast<std::uint16_t>(0x7c00u | sign);
  if (magnitude < 0x38800000u) {
#ifdef __CUDA_ARCH__
    const std::uint32_t sub = __float_as_uint(__fadd_rn(__uint_as_float(magnitude), 0.5f));
#else
    const std::uint32_t sub = std::bit_cast<std::uint32_t>(std::bit_cast<float>(magnitude) + 0.5f);
#endif
    return static_cast<std::uint16_t>((sub - 0x3f000000u) | sign);
  }
  const std::uint32_t normal = (magnitude + (static_cast<std::uint32_t>(15 - 127) << 23) + 0xfffu +
                                ((magnitude >> 13) & 1u)) >>
                               13;
  return static_cast<std::uint16_t>(normal | sign);
}

/// binary16 bits → float (exact), as strata::compress::half_to_float.
__device__ inline float half_to_float(std::uint16_t half) {
  const std::uint32_t sign = static_cast<std::uint32_t>(half & 0x8000u) << 16;
  std::uint32_t bits = static_cast<std::uint32_t>(half & 0x7fffu) << 13;
  const std::uint32_t exponent = bits & 0x0f800000u;
  bits += static_cast<std::uint32_t>(127 - 15) << 23;
  if (exponent == 0x0f800000u) {
    bits += static_cast<std::uint32_t>(128 - 16) << 23;
  } else if (exponent == 0) {
    bits += 1u << 23;
    bits = __float_as_uint(__fsub_rn(__uint_as_float(bits), __uint_as_float(113u << 23)));
  }
  return __uint_as_float(bits | sign);
}

namespace detail {

// Every kernel here is a template (the plain ones `template <int = 0>`, launched as f<<<…>>>)
// so that it has vague linkage: several .cu files of one program may include this header
// without duplicate kernel symbols at link time.
template <int = 0>
__global__ void fp16_encode_kernel(const float* __restrict in, std::size_t n,
                                   unsigned char* __restrict out) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::uint16_t h = float_to_half(in[i]);
    out[2 * i] = static_cast<unsigned char>(h & 0xffu);
    out[2 * i + 1] = static_cast<unsigned char>(h >> 8);
  }
}

template <int = 0>
__global__ void fp16_decode_kernel(const unsigned char* __restrict in, std::size_t n,
                                   float* __restrict out, bool add) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float v = half_to_float(static_cast<std::uint16_t>(in[2 * i] | (in[2 * i + 1] << 8)));
    out[i] = add ? __fadd_rn(out[i], v) : v;
  }
}

inline constexpr unsigned int8_threads = 256;

/// One CUDA block per quantisation block: absmax of the |x| bit patterns (cub::BlockReduce),
/// then the CPU's scale and rounding, operation for operation.
template <std::size_t B>
__global__ void int8_encode_kernel(const float* __restrict in, std::size_t n,
                                   unsigned char* __restrict out) {
  using reduce = cub::BlockReduce<std::uint32_t, int8_threads>;
  __shared__ typename reduce::TempStorage storage;
  __shared__ std::uint32_t top_shared;
  const std::size_t blk = blockIdx.x;
  const std::size_t begin = blk * B;
  const std::size_t len = n - begin < B ? n - begin : B;
  const float* x = in + begin;
  unsigned char* dst = out + blk * (sizeof(float) + B);
  std::uint32_t top = 0;
  for (std::size_t i = threadIdx.x; i < len; i += int8_threads)
    top = max(top, __float_as_uint(x[i]) & 0x7fffffffu);
  top = reduce(storage).Reduce(top, [](std::uint32_t a, std::uint32_t b) { return max(a, b); });
  if (threadIdx.x == 0) top_shared = top;
  __syncthreads();
  top = top_shared;
  unsigned char* q = dst + sizeof(float);
  float scale = 0.0f;
  if (top >= 0x7f800000u) {
    scale = __uint_as_float(0x7fc00000u);
    for (std::size_t i = threadIdx.x; i < len; i += int8_threads)
      q[i] = 0;
  } else if (top == 0) {
    for (std::size_t i = threadIdx.x; i < len; i += int8_threads)
      q[i] = 0;
  } else if (top < 0x0d800000u) {
    const double absmax = static_cast<double>(__uint_as_float(top));
    scale = static_cast<float>(__ddiv_rn(absmax, 127.0));
    const double inverse = __ddiv_rn(127.0, absmax);
    for (std::size_t i = threadIdx.x; i < len; i += int8_threads)
      q[i] = static_cast<unsigned char>(static_cast<std::int8_t>(
          static_cast<int>(rint(__dmul_rn(static_cast<double>(x[i]), inverse)))));
  } else {
    const float absmax = __uint_as_float(top);
    scale = __fdiv_rn(absmax, 127.0f);
    const float inverse = __fdiv_rn(127.0f, absmax);
    constexpr float round_magic = 12582912.0f;
    for (std::size_t i = threadIdx.x; i < len; i += int8_threads) {
      float v = __fsub_rn(__fadd_rn(__fmul_rn(x[i], inverse), round_magic), round_magic);
      v = fminf(127.0f, fmaxf(-127.0f, v));
      q[i] = static_cast<unsigned char>(static_cast<std::int8_t>(static_cast<int>(v)));
    }
  }
  if (threadIdx.x < sizeof(float))
    dst[threadIdx.x] = (__float_as_uint(scale) >> (8 * threadIdx.x)) & 0xffu;
}

/// out[i] (=|+=) scale(block) × q[i]; a scale that is not finite-and-≥0 nor NaN sets *bad.
template <std::size_t B>
__global__ void int8_decode_kernel(const unsigned char* __restrict in, std::size_t n,
                                   float* __restrict out, bool add, int* bad) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t blk = i / B, j = i % B;
    const unsigned char* src = in + blk * (sizeof(float) + B);
    const std::uint32_t sb =
        src[0] | (src[1] << 8) | (src[2] << 16) | (static_cast<std::uint32_t>(src[3]) << 24);
    const float scale = __uint_as_float(sb);
    if (j == 0 && bad != nullptr && !(scale >= 0.0f && scale < INFINITY) && !isnan(scale))
      atomicOr(bad, 1);
    const float v = __fmul_rn(scale, static_cast<float>(static_cast<std::int8_t>(src[4 + j])));
    out[i] = add ? __fadd_rn(out[i], v) : v;
  }
}

template <int = 0>
__global__ void magnitude_keys_kernel(const float* __restrict in, std::size_t n,
                                      std::uint32_t* __restrict keys,
                                      std::uint32_t* __restrict index) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x) {
    keys[i] = __float_as_uint(in[i]) & 0x7fffffffu;
    index[i] = static_cast<std::uint32_t>(i);
  }
}

template <int = 0>
__global__ void topk_pairs_kernel(const float* __restrict in, const std::uint32_t* __restrict idx,
                                  std::size_t k, unsigned char* __restrict out) {
  for (std::size_t p = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; p < k;
       p += std::size_t{gridDim.x} * blockDim.x) {
    const std::uint32_t i = idx[p];
    const std::uint32_t v = __float_as_uint(in[i]);
    unsigned char* dst = out + 8 * p;
    for (int b = 0; b < 4; ++b) {
      dst[b] = (i >> (8 * b)) & 0xffu;
      dst[4 + b] = (v >> (8 * b)) & 0xffu;
    }
  }
}
}  // namespace detail

/// fp16 codec on device buffers (as strata::compress::fp16): encode writes 2·n bytes; decode
/// overwrites, decode_add accumulates. Cost: one pass; memory bound. Async on stream.
struct fp16 {
  static constexpr std::size_t encoded_bytes(std::size_t n) noexcept { return 2 * n; }
  static void encode(const float* in, std::size_t n, std::byte* out, cudaStream_t stream) {
    if (n == 0) return;
    detail::fp16_encode_kernel<<<grid_for(n), 256, 0, stream>>>(
        in, n, reinterpret_cast<unsigned char*>(out));
    check_launch("fp16_encode_kernel", stream);
  }
  static void decode(const std::byte* in, std::size_t n, float* out, cudaStream_t stream) {
    run_decode(in, n, out, false, stream);
  }
  static void decode_add(const std::byte* in, std::size_t n, float* acc, cudaStream_t stream) {
    run_decode(in, n, acc, true, stream);
  }

 private:
  static void run_decode(const std::byte* in, std::size_t n, float* out, bool add,
                         cudaStream_t stream) {
    if (n == 0) return;
    detail::fp16_decode_kernel<<<grid_for(n), 256, 0, stream>>>(
        reinterpret_cast<const unsigned char*>(in), n, out, add);
    check_launch("fp16_decode_kernel", stream);
  }
};

/// int8_block<B> codec on device buffers (as strata::compress::int8_block<B>, same bytes):
/// 4·ceil(n/B) + n bytes. encode: one CUDA block per quantisation block. decode/decode_add set
/// *bad (a device int, may be null) for a corrupt scale instead of throwing — check it after
/// the stream when the bytes came from elsewhere. Async on stream.
template <std::size_t B = 256>
struct int8_block {
  static_assert(B >= 1 && B <= (std::size_t{1} << 24),
                "int8_block: block size must be in [1, 2^24]");
  static constexpr std::size_t blocks(std::size_t n) noexcept { return (n + B - 1) / B; }
  static constexpr std::size_t encoded_bytes(std::size_t n) noexcept {
    return blocks(n) * sizeof(float) + n;
  }
  static void encode(const float* in, std::size_t n, std::byte* out, cudaStream_t stream) {
    if (n == 0) return;
    STRATA_EXPECTS(blocks(n) < 0x7fffffffu, "cuda::int8_block: too many blocks (", blocks(n),
                   "); encode in chunks");
    detail::int8_encode_kernel<B>
        <<<static_cast<unsigned>(blocks(n)), detail::int8_threads, 0, stream>>>(
            in, n, reinterpret_cast<unsigned char*>(out));
    check_launch("int8_encode_kernel", stream);
  }
  static void decode(const std::byte* in, std::size_t n, float* out, cudaStream_t stream,
                     int* bad = nullptr) {
    run_decode(in, n, out, false, stream, bad);
  }
  static void decode_add(const std::byte* in, std::size_t n, float* acc, cudaStream_t stream,
                         int* bad = nullptr) {
    run_decode(in, n, acc, true, stream, bad);
  }

 private:
  static void run_decode(const std::byte* in, std::size_t n, float* out, bool add,
                         cudaStream_t stream, int* bad) {
    if (n == 0) return;
    detail::int8_decode_kernel<B><<<grid_for(n), 256, 0, stream>>>(
        reinterpret_cast<const unsigned char*>(in), n, out, add, bad);
    check_launch("int8_decode_kernel", stream);
  }
};

/// Top-k encoder on the device (same bytes as strata::compress::topk with the same fraction):
/// magnitude bit patterns sorted descending with their indices by cub::DeviceRadixSort (stable,
/// so ties keep the lower index; NaN sorts above inf), the first k indices sorted ascending,
/// then (index, value) pairs written. Cost: two radix sorts (n and k items). Workspace buffers
/// are reused; not thread-safe.
class topk {
 public:
  topk(double fraction, cudaStream_t stream) : fraction_(fraction), stream_(stream) {
    STRATA_EXPECTS(fraction > 0.0 && fraction <= 1.0,
                   "cuda::topk: fraction must be in (0, 1] (the share of entries kept), got ",
                   fraction);
  }
  /// ceil(fraction · n), at least 1 when n ≥ 1, at most n (as compress::topk::kept).
  [[nodiscard]] std::size_t kept(std::size_t n) const noexcept {
    if (n == 0) return 0;
    const double k = std::ceil(fraction_ * static_cast<double>(n) - 1e-9);
    const std::size_t kk = static_cast<std::size_t>(k < 1.0 ? 1.0 : k);
    return kk < 1 ? 1 : (kk > n ? n : kk);
  }
  /// Writes kept(n) pairs (8 bytes each) to out; returns the byte count.
  std::size_t encode(const float* in, std::size_t n, std::byte* out) {
    STRATA_EXPECTS(n <= 0x7fffffffu, "cuda::topk: ", n, " values; encode in chunks below 2^31");
    const std::size_t k = kept(n);
    if (k == 0) return 0;
    keys_.reserve(n);
    sorted_keys_.reserve(n);
    index_.reserve(n);
    sorted_index_.reserve(n);
    detail::magnitude_keys_kernel<<<grid_for(n), 256, 0, stream_>>>(in, n, keys_.data(),
                                                                    index_.data());
    check_launch("magnitude_keys_kernel", stream_);
    std::size_t bytes = 0;
    const int count = static_cast<int>(n);
    STRATA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
        nullptr, bytes, keys_.data(), sorted_keys_.data(), index_.data(), sorted_index_.data(),
        count, 0, 32, stream_));
    temp_.reserve(bytes == 0 ? 1 : bytes);
    STRATA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
        temp_.data(), bytes, keys_.data(), sorted_keys_.data(), index_.data(), sorted_index_.data(),
        count, 0, 32, stream_));
    // Sort the k kept indices ascending (into index_, reused).
    bytes = 0;
    const int kc = static_cast<int>(k);
    STRATA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, bytes, sorted_index_.data(), index_.data(),
                                                kc, 0, 32, stream_));
    temp_.reserve(bytes == 0 ? 1 : bytes);
    STRATA_CHECK(cub::DeviceRadixSort::SortKeys(temp_.data(), bytes, sorted_index_.data(),
                                                index_.data(), kc, 0, 32, stream_));
    detail::topk_pairs_kernel<<<grid_for(k), 256, 0, stream_>>>(
        in, index_.data(), k, reinterpret_cast<unsigned char*>(out));
    check_launch("topk_pairs_kernel", stream_);
    return k * 8;
  }

 private:
  double fraction_;
  cudaStream_t stream_;
  device_buffer<std::uint32_t> keys_{0, stream_}, sorted_keys_{0, stream_}, index_{0, stream_},
      sorted_index_{0, stream_};
  device_buffer<std::byte> temp_{0, stream_};
};

}  // namespace strata::cuda

/// @file link_headers.cuh
/// Every strata CUDA header, for test_link_a.cu and test_link_b.cu: two translation units of
/// one program that both include them must link (a header kernel that is not a template would
/// be defined twice), and each unit's kernels must launch.
#pragma once

#include <cstddef>
#include <vector>

#include "strata/cuda/common.cuh"
#include "strata/cuda/compress.cuh"
#include "strata/cuda/dense.cuh"
#include "strata/cuda/embedding.cuh"
#include "strata/cuda/row_cache.cuh"
#if defined(STRATA_TEST_NCCL)
#include "strata/cuda/nccl.cuh"
#endif

namespace strata::cuda_test {

std::vector<float> relu_launched_by_a(const std::vector<float>& x);
std::vector<float> relu_launched_by_b(const std::vector<float>& x);

/// max(x, 0) on the device, launched through this translation unit's own handle of
/// cuda::detail::relu_kernel (cudaLaunchKernel), so each unit's registration is exercised.
inline std::vector<float> relu_launched_here(const std::vector<float>& x) {
  const std::size_t n = x.size();
  cuda::device_buffer<float> in(n, nullptr), out(n, nullptr);
  STRATA_CHECK(cudaMemcpy(in.data(), x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  const float* in_ptr = in.data();
  float* out_ptr = out.data();
  std::size_t count = n;
  void* args[] = {&in_ptr, &out_ptr, &count};
  STRATA_CHECK(cudaLaunchKernel(reinterpret_cast<const void*>(&cuda::detail::relu_kernel<>),
                                dim3(cuda::grid_for(n)), dim3(256), args, 0, nullptr));
  std::vector<float> y(n);
  STRATA_CHECK(cudaMemcpy(y.data(), out.data(), n * sizeof(float), cudaMemcpyDeviceToHost));
  return y;
}

}  // namespace strata::cuda_test

// Translation unit A of the header link test (see link_headers.cuh); holds the test case.
#include <catch2/catch.hpp>

#include "cuda/link_headers.cuh"
#include "cuda/test_support.cuh"

std::vector<float> strata::cuda_test::relu_launched_by_a(const std::vector<float>& x) {
  return relu_launched_here(x);
}

TEST_CASE(
    "two .cu files that include every CUDA header link into one program and launch their "
    "kernels",
    "[cuda][link]") {
  // That this binary links is the check a GPU-less build makes; the launches need a device.
  if (strata::cuda_test::skip_without_gpu()) return;
  const std::vector<float> x = {-2.0f, -0.5f, 0.0f, 0.25f, 3.0f, -1e30f, 7.5f};
  const std::vector<float> want = {0.0f, 0.0f, 0.0f, 0.25f, 3.0f, 0.0f, 7.5f};
  CHECK(strata::cuda_test::relu_launched_by_a(x) == want);
  CHECK(strata::cuda_test::relu_launched_by_b(x) == want);
}

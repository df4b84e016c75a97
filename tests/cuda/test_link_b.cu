// Translation unit B of the header link test (see link_headers.cuh).
#include "cuda/link_headers.cuh"

std::vector<float> strata::cuda_test::relu_launched_by_b(const std::vector<float>& x) {
  return relu_launched_here(x);
}

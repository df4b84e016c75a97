// The device half of cuda::dlrm for the test and bench programs that use the GPU worker
// (strata/cuda/dlrm_impl.cuh must be included by exactly one .cu file per program).
#include "strata/cuda/dlrm_impl.cuh"

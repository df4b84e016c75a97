// The device half of cuda::dlrm for ctr_train --gpu (strata/cuda/dlrm_impl.cuh must be included
// by exactly one .cu file of a program). Compiled only when strata::cuda exists.
#include "strata/cuda/dlrm_impl.cuh"

// ctr_train --gpu: DLRM with its dense part on CUDA (cuda::dlrm), every strategy x consistency
// x compressor, in its own translation unit (CUDA builds only; ctr_train.hpp).
#include "ctr_train.hpp"

namespace ctr_train_example {

void train_gpu_dlrm(const flags& f, const cuda::dlrm::config& config, optim::adagrad optimizer,
                    optim::adagrad dense_optimizer, const datasets& d) {
  dispatch<cuda::dlrm>(f, config, optimizer, dense_optimizer, d);
}

}  // namespace ctr_train_example

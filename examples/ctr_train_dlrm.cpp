// ctr_train's DLRM compositions (every strategy x consistency x compressor), in their own
// translation unit so they compile beside the other models' (ctr_train.hpp).
#include "ctr_train.hpp"

namespace ctr_train_example {

void train_dlrm(const flags& f, const models::dlrm::config& config, optim::adagrad optimizer,
                optim::adagrad dense_optimizer, const datasets& d) {
  dispatch<models::dlrm>(f, config, optimizer, dense_optimizer, d);
}

}  // namespace ctr_train_example

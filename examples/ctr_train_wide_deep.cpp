// ctr_train's Wide & Deep compositions (every strategy x consistency x compressor), in their
// own translation unit so they compile beside the other models' (ctr_train.hpp).
#include "ctr_train.hpp"

namespace ctr_train_example {

void train_wide_deep(const flags& f, const models::wide_deep::config& config,
                     optim::adagrad optimizer, optim::adam dense_optimizer, const datasets& d) {
  dispatch<models::wide_deep>(f, config, optimizer, dense_optimizer, d);
}

}  // namespace ctr_train_example

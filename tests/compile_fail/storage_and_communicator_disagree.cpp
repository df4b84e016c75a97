// expect: the Storage and the Communicator name different consistency policies
// Must NOT compile: sharded storage under ps::sync with a parameter_server<ps::async>
// communicator (the trainer used to replace the storage's policy without a word).
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"

using namespace strata;
using wrong = train::trainer<models::dlrm, embedding::sharded<optim::adagrad, ps::sync>,
                             train::parameter_server<ps::async>>;

int main() {
  return sizeof(wrong) > 0 ? 0 : 1;
}

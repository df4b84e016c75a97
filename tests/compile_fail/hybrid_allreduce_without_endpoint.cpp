// expect: this Allreduce cannot make an endpoint of the workers from the trainer's Transport
// Must NOT compile: hybrid<C, Allreduce> with an Allreduce that cannot run among the workers
// of the trainer's transport (a user's policy without subset(), or mpi::native_allreduce on
// threads): the trainer would otherwise have to ignore it.
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"

using namespace strata;
struct my_allreduce {
  static constexpr const char* name = "my_allreduce";
};
using wrong = train::trainer<models::dlrm, embedding::sharded<optim::adagrad>,
                             train::hybrid<ps::sync, my_allreduce>>;

int main() {
  return sizeof(wrong) > 0 ? 0 : 1;
}

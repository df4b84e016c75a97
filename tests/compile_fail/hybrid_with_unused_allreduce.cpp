// expect: other Allreduce policies such as mpi::native_allreduce are not used by the trainer yet
// Must NOT compile: hybrid<C, Allreduce> with an Allreduce the trainer would silently ignore
// (mpi::native_allreduce, or a user's policy like this one).
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

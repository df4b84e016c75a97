// expect: the dense gradients are pushes to the servers there
// Must NOT compile: under parameter_server one codec carries the dense gradients and the rows.
#include "strata/compress/fp16.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/compress/per_path.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"

using namespace strata;
using wrong = train::trainer<models::dlrm, embedding::sharded<optim::adagrad>,
                             train::parameter_server<ps::sync>,
                             compress::per_path<compress::int8_block<256>, compress::fp16>>;

int main() {
  return sizeof(wrong) > 0 ? 0 : 1;
}

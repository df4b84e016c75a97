// expect: so the push codec must be compress::identity
// Must NOT compile: ring_allreduce exchanges row gradients lossless; there are no pushes.
#include "strata/compress/fp16.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/compress/per_path.hpp"
#include "strata/embedding/local.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"

using namespace strata;
using wrong = train::trainer<models::dlrm, embedding::local<optim::adagrad>, comm::ring_allreduce,
                             compress::per_path<compress::int8_block<256>, compress::fp16>>;

int main() {
  return sizeof(wrong) > 0 ? 0 : 1;
}

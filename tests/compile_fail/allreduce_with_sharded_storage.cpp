// expect: ring_allreduce replicates the embedding tables on every worker
// Must NOT compile: ring allreduce needs local embedding storage, not tables on PS servers.
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"

using namespace strata;
using wrong = train::trainer<models::dlrm, embedding::sharded<optim::adagrad>, comm::ring_allreduce>;

int main() { return sizeof(wrong) > 0 ? 0 : 1; }

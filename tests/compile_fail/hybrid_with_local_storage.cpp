// expect: parameter_server and hybrid keep the embedding tables on parameter servers
// Must NOT compile: the hybrid strategy keeps embeddings on PS servers, so local storage is wrong.
#include "strata/embedding/local.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"

using namespace strata;
using wrong = train::trainer<models::dlrm, embedding::local<optim::adagrad>, train::hybrid<ps::async>>;

int main() { return sizeof(wrong) > 0 ? 0 : 1; }

// expect: only ps::async takes it
// Must NOT compile: a split-phase pull under ps::sync (it could overlap the worker's own push
// and read rows older than sync allows).
#include "strata/embedding/sharded.hpp"
#include "strata/optim/sgd.hpp"

using namespace strata;

void pull_early(embedding::sharded<optim::sgd, ps::sync>& tables,
                std::span<const ps::table_pull> pulls) {
  tables.begin_gather_tables(pulls);
}

int main() { return 0; }

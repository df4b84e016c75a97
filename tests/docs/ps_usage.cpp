// The parameter-server snippet of docs/ps.md (CI compiles and runs it): 2 workers and 1
// dedicated server as threads; the workers pull embedding rows and push sparse gradients,
// the server applies Adagrad once per step (sync).
#include <cstdio>
#include <vector>

#include "strata/comm/thread_world.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/ps.hpp"

int main() {
  using namespace strata;
  const auto roles = ps::layout::dedicated(/*workers=*/2, /*servers=*/1);
  const ps::shard_map map(roles, {{"user", 1000, 8}, {"item", 5000, 8}}, ps::partition_kind::hash);
  const optim::adagrad optimizer{.lr = 0.1f};

  comm::thread_world world(roles.ranks());
  world.run([&](comm::thread_transport& t) {
    if (roles.is_server(t.rank())) {
      ps::server<optim::adagrad, ps::sync> server(map, roles.server_index(t.rank()), optimizer);
      server.serve(t);  // until every worker shut down
      return;
    }
    embedding::sharded<optim::adagrad, ps::sync> tables(t, map);
    const std::vector<std::uint64_t> keys = {3, 17, 3, 999};  // duplicates are fine
    matrix<float> rows(keys.size(), 8), grads(keys.size(), 8);
    for (int step = 0; step < 3; ++step) {
      tables.gather(0, keys, rows.view());                   // pull (one row per unique key travels)
      for (float& g : grads.flat()) g = 0.01f;               // ... your backward pass here
      tables.apply_gradients(0, keys, grads.view());         // push (duplicates summed first)
    }
    tables.shutdown();
    if (roles.worker_index(t.rank()) == 0) std::printf("row 3 after 3 steps: %f\n", rows(0, 0));
  });
}

// Uses an installed strata: a 2-rank ring allreduce over thread_world.
#include <cstdio>
#include <span>
#include <vector>

#include "strata/comm.hpp"
#include "strata/core.hpp"

int main() {
  std::vector<float> result;
  strata::comm::thread_world(2, {.timeout_seconds = 10}).run([&](auto& t) {
    std::vector<float> grad(1000, static_cast<float>(t.rank() + 1));
    strata::comm::allreduce(t, std::span(grad));
    if (t.rank() == 0) result = grad;
  });
  for (float v : result) {
    if (v != 3.0f) {
      std::fprintf(stderr, "strata_consumer: allreduce gave %g, expected 3\n", v);
      return 1;
    }
  }
  std::printf("strata_consumer: 2-rank allreduce ok (strata %s)\n", STRATA_FOUND_VERSION);
  return 0;
}

// The allreduce snippet of README.md (kept in sync by hand; CI compiles and runs it).
#include <cstdio>
#include <span>
#include <vector>

#include "strata/comm.hpp"
#include "strata/compress.hpp"

int main() {
  // 4 ranks as threads of this process; each holds its own gradient.
  strata::comm::thread_world world(4);
  world.run([](strata::comm::thread_transport& t) {
    std::vector<float> grad(1 << 20, 1.0f + static_cast<float>(t.rank()));

    // Exact ring allreduce: every rank ends with the sum 1 + 2 + 3 + 4 = 10.
    std::vector<float> exact = grad;
    strata::comm::allreduce(t, std::span(exact));

    // The same with int8 blocks on the wire (3.9x fewer bytes) and error feedback.
    strata::compress::error_feedback<strata::compress::int8_block<256>> codec(grad.size());
    strata::compress::compressed_allreduce(t, std::span(grad), codec);

    if (t.rank() == 0)
      std::printf("exact %.3f compressed %.3f, %llu bytes sent by rank 0\n", exact[0], grad[0],
                  static_cast<unsigned long long>(strata::comm::total_bytes_sent(t)));
    if (exact[0] != 10.0f) throw std::runtime_error("allreduce gave the wrong sum");
  });
}

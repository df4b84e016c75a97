// expect: which is bulk-synchronous: use ps::sync
// Must NOT compile: a model whose sizes pick ring allreduce (embeddings < 30% of the
// parameters) cannot train asynchronously.
#include <array>
#include <cstdint>

#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/auto_trainer.hpp"

namespace {
struct dnn_heavy {
  static constexpr std::size_t dense_features = 3;
  static constexpr std::size_t embedding_dim = 4;
  static constexpr std::array<std::uint64_t, 2> table_rows = {10, 10};
  static constexpr std::array<std::size_t, 2> bottom_mlp = {512, 4};
  static constexpr std::array<std::size_t, 2> top_mlp = {512, 1};
};
}  // namespace

using namespace strata;
using wrong = train::auto_trainer<models::static_dlrm<dnn_heavy>, optim::adagrad, ps::async>;

int main() {
  return sizeof(wrong) > 0 ? 0 : 1;
}

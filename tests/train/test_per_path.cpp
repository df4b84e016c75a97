// compress::per_path<Dense, Push>: a codec per path of the hybrid strategy. The dense allreduce
// moves the bytes of the dense codec's run, the pushes those of the push codec's run; one codec
// named twice is the plain compressor, bitwise; residuals of either path survive a resume.
#include <catch2/catch.hpp>

#include <type_traits>

#include "strata/compress/error_feedback.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/compress/per_path.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"
#include "support/ctr_fixtures.hpp"

using namespace strata;
using strata_test::base_options;
using strata_test::make_data;
using strata_test::small_dlrm;

namespace {
using int8_ef = compress::error_feedback<compress::int8_block<256>>;
template <class Compressor>
using hybrid_with = train::trainer<models::dlrm, embedding::sharded<optim::adagrad>,
                                   train::hybrid<ps::sync>, Compressor>;

template <class Compressor>
train::train_report run(const data::ctr_dataset& data, train::trainer_options options) {
  optim::adagrad opt;
  opt.lr = 0.05f;
  hybrid_with<Compressor> trainer(small_dlrm(), opt, options);
  return trainer.fit(data);
}
}  // namespace

TEST_CASE("per_path: each path moves the bytes of its own codec", "[train][per_path]") {
  const auto data = make_data(1500, 31);
  auto options = base_options(2, 16);
  options.servers = 1;
  const auto dense_int8 = run<int8_ef>(data, options);
  const auto push_fp16 = run<compress::fp16>(data, options);
  const auto split = run<compress::per_path<int8_ef, compress::fp16>>(data, options);
  // Worker to worker: the dense allreduce only (int8); worker to server: pulls and pushes (fp16).
  REQUIRE(dense_int8.bytes_worker_to_worker != push_fp16.bytes_worker_to_worker);
  CHECK(split.bytes_worker_to_worker == dense_int8.bytes_worker_to_worker);
  REQUIRE(dense_int8.bytes_worker_to_server != push_fp16.bytes_worker_to_server);
  CHECK(split.bytes_worker_to_server == push_fp16.bytes_worker_to_server);
  // Neither plain run is the split one.
  CHECK(split.embedding_checksum != dense_int8.embedding_checksum);
  CHECK(split.embedding_checksum != push_fp16.embedding_checksum);

  // One codec named for both paths is that codec.
  const auto same = run<compress::per_path<compress::fp16, compress::fp16>>(data, options);
  CHECK(same.dense_checksum == push_fp16.dense_checksum);
  CHECK(same.embedding_checksum == push_fp16.embedding_checksum);
}

TEST_CASE("per_path: a compressed dense path with lossless pushes resumes bitwise",
          "[train][per_path][checkpoint]") {
  // The dense residual must go into the checkpoint although the pushes keep none.
  using split = compress::per_path<int8_ef, compress::identity>;
  STATIC_REQUIRE(hybrid_with<split>::lossless);
  STATIC_REQUIRE(std::is_same_v<hybrid_with<split>::dense_compressor_type, int8_ef>);
  const auto data = make_data(2000, 32);
  auto options = base_options(2, 12);
  const auto full = run<split>(data, options);
  REQUIRE(full.steps == 12);
  options.checkpoint_dir = strata_test::fresh_dir("per-path-resume");
  options.checkpoint_every = 5;
  options.max_steps = 5;
  (void)run<split>(data, options);
  options.max_steps = 12;
  options.resume = true;
  const auto resumed = run<split>(data, options);
  CHECK(resumed.first_step == 5);
  CHECK(resumed.dense_checksum == full.dense_checksum);
  CHECK(resumed.embedding_checksum == full.embedding_checksum);
}

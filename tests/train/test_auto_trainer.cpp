// Compile-time strategy from the model's shape: static_dlrm<Shape>'s sizes equal the runtime
// model's, the size rule picks Communicator and Storage (the same rule as --strategy auto), and
// an auto_trainer trains bitwise the model of the composition it names.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <type_traits>

#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/auto_trainer.hpp"
#include "support/ctr_fixtures.hpp"

using namespace strata;

namespace {

/// strata_test::small_dlrm() as a type: 2.9 KB of tables, 788 B of MLPs (78% embeddings).
struct small_shape {
  static constexpr std::size_t dense_features = 3;
  static constexpr std::size_t embedding_dim = 4;
  static constexpr std::array<std::uint64_t, 4> table_rows = {40, 50, 30, 60};
  static constexpr std::array<std::size_t, 2> bottom_mlp = {8, 4};
  static constexpr std::array<std::size_t, 2> top_mlp = {8, 1};
};
/// The same tables with a wide MLP: embeddings are 1.3% of the parameters.
struct wide_mlp_shape : small_shape {
  static constexpr std::array<std::size_t, 3> bottom_mlp = {128, 64, 4};
  static constexpr std::array<std::size_t, 3> top_mlp = {256, 128, 1};
};
/// Between the thresholds: embeddings ≈ 48% of the parameters.
struct balanced_shape : small_shape {
  static constexpr std::array<std::size_t, 2> bottom_mlp = {32, 4};
  static constexpr std::array<std::size_t, 3> top_mlp = {32, 8, 1};
};
/// Huge tables and a 256 MiB DNN: embeddings dominate, but the DNN is not small.
struct big_dnn_shape {
  static constexpr std::size_t dense_features = 13;
  static constexpr std::size_t embedding_dim = 64;
  static constexpr std::array<std::uint64_t, 2> table_rows = {100'000'000, 100'000'000};
  static constexpr std::array<std::size_t, 3> bottom_mlp = {8192, 8192, 64};
  static constexpr std::array<std::size_t, 1> top_mlp = {1};
};

template <class Shape>
void expect_sizes_of_the_runtime_model() {
  using model = models::static_dlrm<Shape>;
  const model m(model::shape_config());
  std::uint64_t embedding = 0;
  for (const auto& t : m.tables())
    embedding += t.rows * t.dim * sizeof(float);
  CHECK(model::embedding_bytes == embedding);
  CHECK(model::dense_bytes == m.parameters().size() * sizeof(float));
  // The runtime rule (ctr_train --strategy auto) is the compile-time one.
  constexpr auto kind = train::choose_strategy_kind(model::embedding_bytes, model::dense_bytes);
  const std::string name = train::choose_strategy(embedding, m.parameters().size() * 4);
  CHECK(name == (kind == train::strategy_kind::parameter_server ? "ps"
                 : kind == train::strategy_kind::allreduce      ? "allreduce"
                                                                : "hybrid"));
}

}  // namespace

TEST_CASE("static_dlrm's compile-time sizes are the runtime model's", "[train][auto_trainer]") {
  expect_sizes_of_the_runtime_model<models::criteo_kaggle_dlrm>();
  expect_sizes_of_the_runtime_model<small_shape>();
  expect_sizes_of_the_runtime_model<wide_mlp_shape>();
  expect_sizes_of_the_runtime_model<balanced_shape>();
  using kaggle = models::static_dlrm<models::criteo_kaggle_dlrm>;
  STATIC_REQUIRE(kaggle::dense_bytes ==
                 4 * ((13 * 512 + 512) + (512 * 256 + 256) + (256 * 64 + 64) + (64 * 16 + 16) +
                      (367 * 512 + 512) + (512 * 256 + 256) + (256 + 1)));
  STATIC_REQUIRE(kaggle::embedding_bytes == std::uint64_t{33'762'577} * 16 * 4);
  // No 1.6 GB DNN is built here: its sizes are arithmetic.
  STATIC_REQUIRE(models::static_dlrm<big_dnn_shape>::dense_bytes > (std::uint64_t{256} << 20));
}

TEST_CASE("auto_trainer composes Communicator and Storage from the model's shape",
          "[train][auto_trainer]") {
  using optim::adagrad;
  using kaggle = models::static_dlrm<models::criteo_kaggle_dlrm>;
  STATIC_REQUIRE(std::is_same_v<train::auto_trainer<kaggle, adagrad>,
                                train::trainer<kaggle, embedding::sharded<adagrad, ps::sync>,
                                               train::parameter_server<ps::sync>>>);
  using async_kaggle = train::auto_trainer<kaggle, adagrad, ps::async>;
  STATIC_REQUIRE(std::is_same_v<async_kaggle::storage_type::consistency_type, ps::async>);
  STATIC_REQUIRE(std::is_same_v<async_kaggle::consistency_type, ps::async>);

  using wide = models::static_dlrm<wide_mlp_shape>;
  STATIC_REQUIRE(
      std::is_same_v<train::auto_trainer<wide, adagrad>,
                     train::trainer<wide, embedding::local<adagrad>, comm::ring_allreduce>>);
  using balanced = models::static_dlrm<balanced_shape>;
  STATIC_REQUIRE(std::is_same_v<
                 train::auto_trainer<balanced, adagrad>,
                 train::trainer<balanced, embedding::sharded<adagrad>, train::hybrid<ps::sync>>>);
  // ≥ 70% embeddings but a DNN above 64 MiB: hybrid, not PS (docs/ctr.md says why).
  using big = models::static_dlrm<big_dnn_shape>;
  STATIC_REQUIRE(train::auto_composition<big, adagrad>::kind == train::strategy_kind::hybrid);
}

TEST_CASE("an auto_trainer trains bitwise the model of the composition it names",
          "[train][auto_trainer]") {
  const auto data = strata_test::make_data(1200, 21);
  const auto eval = strata_test::make_data(300, 22);
  optim::adagrad opt;
  opt.lr = 0.05f;
  const auto options = strata_test::base_options(2, 16);
  {
    using model = models::static_dlrm<small_shape>;
    train::auto_trainer<model, optim::adagrad> automatic(model::shape_config(), opt, options);
    train::trainer<models::dlrm, embedding::sharded<optim::adagrad>,
                   train::parameter_server<ps::sync>>
        named(strata_test::small_dlrm(), opt, options);
    const auto a = automatic.fit(data, &eval);
    const auto n = named.fit(data, &eval);
    CHECK(a.strategy == std::string("ps"));
    CHECK(a.dense_checksum == n.dense_checksum);
    CHECK(a.embedding_checksum == n.embedding_checksum);
    CHECK(a.evals.back().auc == n.evals.back().auc);
  }
  {
    using model = models::static_dlrm<wide_mlp_shape>;
    train::auto_trainer<model, optim::adagrad> automatic(model::shape_config(), opt, options);
    train::trainer<models::dlrm, embedding::local<optim::adagrad>, comm::ring_allreduce> named(
        model::shape_config(), opt, options);
    const auto a = automatic.fit(data, &eval);
    const auto n = named.fit(data, &eval);
    CHECK(a.strategy == std::string("allreduce"));
    CHECK(a.dense_checksum == n.dense_checksum);
    CHECK(a.embedding_checksum == n.embedding_checksum);
  }
}

TEST_CASE("static_dlrm refuses a configuration of other sizes", "[train][auto_trainer][errors]") {
  using model = models::static_dlrm<small_shape>;
  auto c = model::shape_config();
  c.seed = 9;  // free
  c.gemm = nn::gemm_engine::eigen;
  REQUIRE_NOTHROW(model(c));
  auto one_value = model::shape_config();
  one_value.table_rows = {40};  // one value for every table: not this shape's rows
  REQUIRE_THROWS_WITH(model(one_value), Catch::Contains("sizes differ from the shape type's"));
  auto wider = model::shape_config();
  wider.top_mlp = {16, 1};
  REQUIRE_THROWS_WITH(model(wider),
                      Catch::Contains("start from static_dlrm<Shape>::shape_config()"));
}

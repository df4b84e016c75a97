// The trainer's parts: a dense optimizer of its own (per-part optimizers), Wide & Deep through
// every strategy, the model's own input columns and initialisation, and a Wide & Deep that
// learns at least as well as the exact logistic regression of the same features.
#include <catch2/catch.hpp>

#include <Eigen/Dense>
#include <Eigen/Sparse>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <vector>

#include "strata/data/metrics.hpp"
#include "strata/data/sampler.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
#include "strata/nn/loss.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/adam.hpp"
#include "strata/optim/ftrl.hpp"
#include "strata/optim/sgd.hpp"
#include "strata/optim/table_groups.hpp"
#include "strata/train/trainer.hpp"
#include "support/catch_error.hpp"
#include "support/ctr_fixtures.hpp"

using namespace strata;
using strata_test::base_options;
using strata_test::make_data;
using strata_test::small_dlrm;
using strata_test::small_wide_deep;

namespace {

template <class Model, class Opt, class DenseOpt = Opt>
using allreduce_trainer = train::trainer<Model, embedding::local<Opt>, comm::ring_allreduce,
                                         compress::identity, comm::thread_transport, DenseOpt>;
template <class Model, class Opt, class DenseOpt = Opt>
using hybrid_trainer = train::trainer<Model, embedding::sharded<Opt>, train::hybrid<ps::sync>,
                                      compress::identity, comm::thread_transport, DenseOpt>;
template <class Model, class Opt, class DenseOpt = Opt>
using ps_trainer = train::trainer<Model, embedding::sharded<Opt>, train::parameter_server<ps::sync>,
                                  compress::identity, comm::thread_transport, DenseOpt>;

}  // namespace

TEST_CASE("a dense optimizer of its own: the trainer equals a hand-written step loop",
          "[train][optimizers]") {
  const auto data = make_data(2000, 21);
  optim::adagrad tables_opt;
  tables_opt.lr = 0.05f;
  optim::adam mlp_opt;
  mlp_opt.lr = 0.01f;
  const auto options = base_options(1, 24);
  allreduce_trainer<models::dlrm, optim::adagrad, optim::adam> trainer(small_dlrm(), tables_opt,
                                                                       mlp_opt, options);
  trainer.fit(data);

  // The same 12 steps by hand: row-wise Adagrad on the tables, row-wise Adam on the dense
  // parameters cut into rows of dense_row (the last row zero-padded).
  auto config = small_dlrm();
  config.seed = options.seed;
  models::dlrm model(config);
  const auto specs = model.tables();
  std::vector<std::uint64_t> rows;
  for (const auto& s : specs)
    rows.push_back(s.rows);
  embedding::local<optim::adagrad> tables(specs, tables_opt,
                                          embedding::uniform_init::for_rows(options.seed, rows));
  const std::size_t d = options.dense_row, count = model.parameters().size();
  const std::size_t dense_rows = (count + d - 1) / d, sf = optim::adam::state_floats(d);
  std::vector<float> state(dense_rows * sf, 0.0f), row(d), grad(d);
  data::sharded_sampler sampler(data.size(), 1, 0, options.batch, options.seed);
  data::ctr_batch batch;
  std::vector<std::vector<std::uint64_t>> keys(specs.size());
  std::vector<matrix<float>> embedded, embedded_grads;
  for (const auto& s : specs) {
    embedded.emplace_back(options.batch, s.dim);
    embedded_grads.emplace_back(options.batch, s.dim);
  }
  std::vector<matrix_view<const float>> inputs;
  std::vector<matrix_view<float>> grad_views;
  for (std::size_t t = 0; t < specs.size(); ++t) {
    inputs.push_back(embedded[t].view());
    grad_views.push_back(embedded_grads[t].view());
  }
  std::vector<float> logits(options.batch), dlogits(options.batch);
  for (std::size_t step = 0; step < options.max_steps; ++step) {
    data.gather(sampler.batch(step), batch);
    for (std::size_t t = 0; t < specs.size(); ++t) {
      keys[t].resize(options.batch);
      for (std::size_t i = 0; i < options.batch; ++i)
        keys[t][i] = batch.keys(i, t);
      tables.gather(t, keys[t], embedded[t].view());
    }
    model.forward({batch.dense.view(), inputs}, logits);
    nn::bce_with_logits(logits, batch.labels, dlogits, 1.0f / static_cast<float>(options.batch),
                        nn::reduction::sum);
    model.backward(dlogits, grad_views);
    auto params = model.parameters();
    const auto grads = model.gradients();
    for (std::size_t r = 0; r < dense_rows; ++r) {
      const std::size_t first = r * d, n = std::min(d, count - first);
      std::fill(row.begin(), row.end(), 0.0f);
      std::fill(grad.begin(), grad.end(), 0.0f);
      std::copy_n(params.begin() + static_cast<std::ptrdiff_t>(first), n, row.begin());
      std::copy_n(grads.begin() + static_cast<std::ptrdiff_t>(first), n, grad.begin());
      mlp_opt.apply(row, std::span(state).subspan(r * sf, sf), grad);
      std::copy_n(row.begin(), n, params.begin() + static_cast<std::ptrdiff_t>(first));
    }
    for (std::size_t t = 0; t < specs.size(); ++t)
      tables.apply_gradients(t, keys[t], embedded_grads[t].view());
  }
  const auto by_hand = model.parameters();
  CHECK(trainer.dense_parameters() == std::vector<float>(by_hand.begin(), by_hand.end()));
  std::size_t compared = 0;
  trainer.for_each_embedding_row(
      [&](std::size_t t, std::uint64_t key, std::span<const float> r, std::span<const float>) {
        const auto expected = tables.row(t, key);
        REQUIRE(std::equal(r.begin(), r.end(), expected.begin(), expected.end()));
        ++compared;
      });
  CHECK(compared == 40 + 50 + 30 + 60);

  // The dense optimizer really acts: the tables' optimizer on the MLP trains another model.
  allreduce_trainer<models::dlrm, optim::adagrad> one_optimizer(small_dlrm(), tables_opt, options);
  one_optimizer.fit(data);
  CHECK(one_optimizer.dense_parameters() != trainer.dense_parameters());
}

TEST_CASE("per-part optimizers: every strategy trains the same model bitwise, any worker count",
          "[train][optimizers][equivalence]") {
  const auto data = make_data(2000, 22);
  optim::adagrad tables_opt;
  tables_opt.lr = 0.05f;
  optim::adam mlp_opt;
  mlp_opt.lr = 0.01f;
  for (int workers : {1, 2, 3}) {
    INFO("workers " << workers);
    auto options = base_options(workers, 24 / static_cast<std::size_t>(workers));
    allreduce_trainer<models::dlrm, optim::adagrad, optim::adam> a(small_dlrm(), tables_opt,
                                                                   mlp_opt, options);
    hybrid_trainer<models::dlrm, optim::adagrad, optim::adam> h(small_dlrm(), tables_opt, mlp_opt,
                                                                options);
    const auto ra = a.fit(data);
    const auto rh = h.fit(data);
    CHECK(ra.dense_checksum == rh.dense_checksum);
    CHECK(ra.embedding_checksum == rh.embedding_checksum);
    // parameter_server: the servers apply Adam to the dense table.
    options.servers = workers == 1 ? 1 : 0;
    ps_trainer<models::dlrm, optim::adagrad, optim::adam> p(small_dlrm(), tables_opt, mlp_opt,
                                                            options);
    const auto rp = p.fit(data);
    CHECK(ra.dense_checksum == rp.dense_checksum);
    CHECK(ra.embedding_checksum == rp.embedding_checksum);
    CHECK(a.dense_parameters() == p.dense_parameters());
  }
}

TEST_CASE("a checkpoint names its optimizers; resuming with others is refused",
          "[train][optimizers][checkpoint]") {
  const auto data = make_data(2000, 23);
  optim::adagrad tables_opt;
  tables_opt.lr = 0.05f;
  auto options = base_options(1, 24);
  options.checkpoint_dir = strata_test::fresh_dir("parts-optimizers");
  allreduce_trainer<models::dlrm, optim::adagrad, optim::adam> writer(small_dlrm(), tables_opt,
                                                                      optim::adam{}, options);
  writer.fit(data);
  options.resume = true;
  options.max_steps = 20;
  allreduce_trainer<models::dlrm, optim::adagrad> other(small_dlrm(), tables_opt, options);
  const auto e = strata_test::catch_error([&] { other.fit(data); });
  CHECK(e.code() == errc::corrupt_data);
  CHECK_THAT(e.what(), Catch::Contains("adagrad (tables) and adam (dense)") &&
                           Catch::Contains("resume with the optimizers it was written with"));
  // The same optimizers resume.
  allreduce_trainer<models::dlrm, optim::adagrad, optim::adam> same(small_dlrm(), tables_opt,
                                                                    optim::adam{}, options);
  CHECK(same.fit(data).first_step == 12);
  std::filesystem::remove_all(options.checkpoint_dir);
}

TEST_CASE("Wide & Deep trains through every strategy: bitwise-identical, wide tables from zero",
          "[train][wide_deep][equivalence]") {
  const auto data = make_data(2000, 24);
  optim::adagrad opt;
  opt.lr = 0.05f;
  {
    // The wide tables (0..3) start at zero, the deep ones (4..7) at random.
    allreduce_trainer<models::wide_deep, optim::adagrad> fresh(small_wide_deep(), opt,
                                                               base_options(1, 24));
    std::size_t wide_nonzero = 0, deep_nonzero = 0;
    fresh.for_each_embedding_row(
        [&](std::size_t t, std::uint64_t, std::span<const float> row, std::span<const float>) {
          const auto nonzero = static_cast<std::size_t>(
              std::count_if(row.begin(), row.end(), [](float v) { return v != 0.0f; }));
          (t < 4 ? wide_nonzero : deep_nonzero) += nonzero;
        });
    CHECK(wide_nonzero == 0);
    CHECK(deep_nonzero > 0);
  }
  for (int workers : {1, 2}) {
    INFO("workers " << workers);
    auto options = base_options(workers, 24 / static_cast<std::size_t>(workers));
    allreduce_trainer<models::wide_deep, optim::adagrad> a(small_wide_deep(), opt, options);
    hybrid_trainer<models::wide_deep, optim::adagrad> h(small_wide_deep(), opt, options);
    const auto ra = a.fit(data);
    const auto rh = h.fit(data);
    options.servers = 0;
    ps_trainer<models::wide_deep, optim::adagrad> p(small_wide_deep(), opt, options);
    const auto rp = p.fit(data);
    REQUIRE(ra.steps == 12);
    CHECK(ra.dense_checksum == rh.dense_checksum);
    CHECK(ra.dense_checksum == rp.dense_checksum);
    CHECK(ra.embedding_checksum == rh.embedding_checksum);
    CHECK(ra.embedding_checksum == rp.embedding_checksum);
  }
}

namespace {

/// The exact (float64, Newton) L2-regularised logistic regression on the dense features and a
/// one-hot of every key: the wide part of Wide & Deep alone, fitted to convergence. Returns the
/// held-out logits.
std::vector<float> logistic_regression_logits(const data::ctr_dataset& train,
                                              const data::ctr_dataset& held_out,
                                              std::span<const std::uint64_t> table_rows,
                                              double l2) {
  std::vector<std::size_t> offset{1 + train.dense_cols()};  // bias, dense, then one-hots
  for (const auto r : table_rows)
    offset.push_back(offset.back() + r);
  const auto width = static_cast<Eigen::Index>(offset.back());
  const auto features = [&](const data::ctr_dataset& set, std::size_t i, Eigen::VectorXd& x) {
    x.setZero(width);
    x[0] = 1.0;
    data::ctr_batch one;
    const std::size_t index[] = {i};
    set.gather(index, one);
    for (std::size_t c = 0; c < set.dense_cols(); ++c)
      x[static_cast<Eigen::Index>(1 + c)] = one.dense(0, c);
    for (std::size_t f = 0; f < set.sparse_cols(); ++f)
      x[static_cast<Eigen::Index>(offset[f] + one.keys(0, f))] = 1.0;
  };
  // X is sparse (bias, dense features, one 1 per sparse column): X^T·D·X costs 64 products per
  // row instead of width² (the dense form took minutes in the sanitizer build).
  std::vector<Eigen::Triplet<double>> entries;
  Eigen::VectorXd y(static_cast<Eigen::Index>(train.size())), row;
  for (std::size_t i = 0; i < train.size(); ++i) {
    features(train, i, row);
    for (Eigen::Index c = 0; c < width; ++c)
      if (row[c] != 0.0) entries.emplace_back(static_cast<Eigen::Index>(i), c, row[c]);
    data::ctr_batch one;
    const std::size_t index[] = {i};
    train.gather(index, one);
    y[static_cast<Eigen::Index>(i)] = one.labels[0];
  }
  Eigen::SparseMatrix<double> x(static_cast<Eigen::Index>(train.size()), width);
  x.setFromTriplets(entries.begin(), entries.end());
  const Eigen::SparseMatrix<double> xt = x.transpose();
  Eigen::VectorXd w = Eigen::VectorXd::Zero(width);
  for (int iteration = 0; iteration < 25; ++iteration) {
    const Eigen::VectorXd p =
        (-(x * w).array()).exp().unaryExpr([](double e) { return 1.0 / (1.0 + e); });
    const Eigen::VectorXd gradient = xt * (p - y) + l2 * w;
    const Eigen::VectorXd curvature = (p.array() * (1.0 - p.array())).matrix();
    const Eigen::SparseMatrix<double> weighted = xt * curvature.asDiagonal();
    Eigen::MatrixXd hessian = Eigen::MatrixXd(weighted * x);
    hessian.diagonal().array() += l2;
    const Eigen::VectorXd newton_step = hessian.ldlt().solve(gradient);
    w -= newton_step;
    if (newton_step.lpNorm<Eigen::Infinity>() < 1e-10) break;  // converged (quadratically)
  }
  std::vector<float> logits(held_out.size());
  for (std::size_t i = 0; i < held_out.size(); ++i) {
    features(held_out, i, row);
    logits[i] = static_cast<float>(row.dot(w));
  }
  return logits;
}

}  // namespace

TEST_CASE("Wide & Deep learns at least as well as the exact logistic regression of its wide part",
          "[train][wide_deep][quality]") {
  // The labels come from a logistic model of the dense features and per-key terms: a logistic
  // regression on dense + one-hot keys is the true model family, fitted exactly in float64.
  const auto train_set = make_data(20000, 31);
  const auto held_out = make_data(5000, 32);
  const std::uint64_t table_rows[] = {40, 50, 30, 60};
  std::vector<float> labels;
  for (std::size_t i = 0; i < held_out.size(); ++i) {
    data::ctr_batch one;
    const std::size_t index[] = {i};
    held_out.gather(index, one);
    labels.push_back(one.labels[0]);
  }
  const double reference =
      data::auc(logistic_regression_logits(train_set, held_out, table_rows, 1.0), labels);
  INFO("logistic regression (float64, Newton) held-out AUC " << reference);

  optim::adagrad tables_opt;
  tables_opt.lr = 0.05f;
  optim::adam mlp_opt;
  mlp_opt.lr = 0.003f;
  auto options = base_options(1, 128);
  options.max_steps = 0;
  options.epochs = 3;
  allreduce_trainer<models::wide_deep, optim::adagrad, optim::adam> wd(
      small_wide_deep(), tables_opt, mlp_opt, options);
  const auto report = wd.fit(train_set, &held_out);
  REQUIRE(!report.evals.empty());
  const double auc = report.evals.back().auc;
  INFO("Wide & Deep held-out AUC " << auc);
  CHECK(auc >= reference - 0.005);
}

TEST_CASE("Wide & Deep with FTRL on its wide tables and Adagrad on its deep ones",
          "[train][wide_deep][optimizers]") {
  using groups = optim::table_groups<optim::ftrl, optim::adagrad>;
  const auto data = make_data(2000, 27);
  const models::wide_deep probe(small_wide_deep());
  groups tables_opt;
  tables_opt.second.lr = 0.05f;
  for (std::size_t t = 0; t < probe.tables().size(); ++t)
    tables_opt.in_first.push_back(probe.zero_initialised(t));  // the wide tables
  optim::adam mlp_opt;
  mlp_opt.lr = 0.003f;
  const auto options = base_options(2, 16);
  allreduce_trainer<models::wide_deep, groups, optim::adam> a(small_wide_deep(), tables_opt,
                                                              mlp_opt, options);
  ps_trainer<models::wide_deep, groups, optim::adam> p(small_wide_deep(), tables_opt, mlp_opt,
                                                       options);
  const auto ra = a.fit(data);
  const auto rp = p.fit(data);
  CHECK(ra.dense_checksum == rp.dense_checksum);
  CHECK(ra.embedding_checksum == rp.embedding_checksum);
  // With no table in the first group it trains exactly as Adagrad alone; with the wide tables
  // there, differently.
  auto none_first = tables_opt;
  none_first.in_first.assign(none_first.in_first.size(), false);
  allreduce_trainer<models::wide_deep, groups, optim::adam> g0(small_wide_deep(), none_first,
                                                               mlp_opt, options);
  allreduce_trainer<models::wide_deep, optim::adagrad, optim::adam> plain(
      small_wide_deep(), tables_opt.second, mlp_opt, options);
  const auto r0 = g0.fit(data);
  const auto rplain = plain.fit(data);
  CHECK(r0.dense_checksum == rplain.dense_checksum);
  CHECK(r0.embedding_checksum == rplain.embedding_checksum);
  CHECK(ra.embedding_checksum != rplain.embedding_checksum);
}

TEST_CASE("Wide & Deep's deep MLP keeps its random initialisation after a step",
          "[train][wide_deep][optimizers]") {
  // FTRL on the MLP sets every weight from its (z, n) after the first update, wiping out the
  // initialisation; a dense optimizer of its own (Adam here) moves each weight a little.
  const auto data = make_data(2000, 25);
  optim::ftrl wide_opt;
  optim::adam mlp_opt;
  mlp_opt.lr = 0.001f;
  auto options = base_options(1, 24);
  options.max_steps = 1;
  allreduce_trainer<models::wide_deep, optim::ftrl, optim::adam> wd(small_wide_deep(), wide_opt,
                                                                    mlp_opt, options);
  wd.fit(data);
  const models::wide_deep probe([] {
    auto c = small_wide_deep();
    c.seed = 5;
    return c;
  }());
  const auto params = wd.dense_parameters();
  for (const auto& block : probe.parameter_blocks().blocks()) {
    if (block.name.find("weight") == std::string::npos) continue;
    INFO(block.name);
    const std::set<float> distinct(
        params.begin() + static_cast<std::ptrdiff_t>(block.offset),
        params.begin() + static_cast<std::ptrdiff_t>(block.offset + block.size));
    CHECK(distinct.size() * 10 >= block.size * 9);
    // and each moved by at most about the learning rate from where it started
    std::size_t far = 0;
    for (std::size_t i = block.offset; i < block.offset + block.size; ++i)
      if (std::abs(params[i] - probe.parameters()[i]) > 1.5f * mlp_opt.lr) ++far;
    CHECK(far == 0);
  }
  // The test tells the two apart: FTRL on the MLP moves its weights far from where they began.
  allreduce_trainer<models::wide_deep, optim::ftrl> ftrl_everywhere(small_wide_deep(), wide_opt,
                                                                    options);
  ftrl_everywhere.fit(data);
  const auto wiped = ftrl_everywhere.dense_parameters();
  std::size_t far = 0;
  for (const auto& block : probe.parameter_blocks().blocks())
    if (block.name.find("weight") != std::string::npos)
      for (std::size_t i = block.offset; i < block.offset + block.size; ++i)
        if (std::abs(wiped[i] - probe.parameters()[i]) > 1.5f * mlp_opt.lr) ++far;
  CHECK(far > 0);
}

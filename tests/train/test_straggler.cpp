// trainer_options::compute_slowdown (a straggler: one worker computes F times slower) moves
// only time, never results; eval_point::train_seconds stamps each evaluation with worker 0's
// training time (for time-to-AUC curves); bad slowdowns are refused.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"
#include "support/catch_error.hpp"
#include "support/ctr_fixtures.hpp"

using namespace strata;

namespace {

using ps_trainer = train::trainer<models::dlrm, embedding::sharded<optim::adagrad>,
                                  train::parameter_server<ps::sync>>;
using allreduce_trainer =
    train::trainer<models::dlrm, embedding::local<optim::adagrad>, comm::ring_allreduce>;

template <class Trainer>
train::train_report fit(const train::trainer_options& options, const data::ctr_dataset& data,
                        const data::ctr_dataset* eval = nullptr) {
  optim::adagrad opt;
  opt.lr = 0.05f;
  Trainer trainer(strata_test::small_dlrm(), opt, options);
  return trainer.fit(data, eval);
}

}  // namespace

TEST_CASE("a straggler moves time, never results: sync PS and allreduce stay bitwise",
          "[train][straggler]") {
  const auto data = strata_test::make_data(2000, 17);
  auto plain = strata_test::base_options(2, 16);
  plain.max_steps = 20;
  auto slow = plain;
  slow.compute_slowdown = {20.0, 1.0};  // worker 0 computes 20x slower
  {
    const auto a = fit<ps_trainer>(plain, data);
    const auto b = fit<ps_trainer>(slow, data);
    CHECK(a.dense_checksum == b.dense_checksum);
    CHECK(a.embedding_checksum == b.embedding_checksum);
    // Worker 0's compute phase waited 19x its own compute time: well above the plain run's
    // (a margin of 4x leaves room for a loaded machine).
    CHECK(b.phase_seconds[train::compute_phase] > 5 * a.phase_seconds[train::compute_phase]);
  }
  {
    const auto a = fit<allreduce_trainer>(plain, data);
    const auto b = fit<allreduce_trainer>(slow, data);
    CHECK(a.dense_checksum == b.dense_checksum);
    CHECK(a.embedding_checksum == b.embedding_checksum);
    CHECK(b.phase_seconds[train::compute_phase] > 5 * a.phase_seconds[train::compute_phase]);
  }
}

TEST_CASE("evaluations carry worker 0's training time, increasing, within the run's time",
          "[train][straggler]") {
  const auto data = strata_test::make_data(2000, 17);
  const auto eval = strata_test::make_data(300, 99);
  auto options = strata_test::base_options(2, 16);
  options.max_steps = 30;
  options.eval_every = 10;
  const auto r = fit<allreduce_trainer>(options, data, &eval);
  REQUIRE(r.evals.size() == 3);
  double before = 0;
  for (const auto& e : r.evals) {
    CHECK(e.train_seconds > before);
    before = e.train_seconds;
  }
  double phases = 0;
  for (double s : r.phase_seconds)
    phases += s;
  CHECK(r.evals.back().train_seconds == Approx(phases).epsilon(1e-9));
  CHECK(r.evals.back().train_seconds <= r.seconds);
}

TEST_CASE("bad compute slowdowns are refused, naming the worker and the range",
          "[train][straggler][errors]") {
  auto options = strata_test::base_options(2, 16);
  const auto refused = [&](std::vector<double> factors, std::string_view says) {
    options.compute_slowdown = std::move(factors);
    const auto e = strata_test::catch_error([&] { options.check(); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(strata_test::contains(e.what(), says));
  };
  refused({2.0}, "compute_slowdown needs one factor per worker (2), got 1");
  refused({1.0, 0.5}, "compute_slowdown[1] must be a finite factor ≥ 1, got 0.5");
  refused({std::numeric_limits<double>::quiet_NaN(), 1.0},
          "compute_slowdown[0] must be a finite factor ≥ 1, got nan");
  options.compute_slowdown = {1.0, 3.0};
  CHECK_NOTHROW(options.check());
}

// hybrid<ps::sync, mpi::native_allreduce> under mpiexec (2 workers + 1 server): the trainer
// hands the dense gradients to MPI_Allreduce on a communicator of the workers — counted here
// through MPI's profiling interface — and trains the model of strata's ring.
#include <catch2/catch.hpp>

#include <mpi.h>

#include <atomic>

#include "strata/embedding/sharded.hpp"
#include "strata/mpi/environment.hpp"
#include "strata/mpi/native_allreduce.hpp"
#include "strata/mpi/transport.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/trainer.hpp"
#include "support/ctr_fixtures.hpp"
#include "support/skip.hpp"

namespace {
std::atomic<long> allreduce_calls{0};
}  // namespace

// Every MPI_Allreduce of this program goes through here (the PMPI profiling interface), then to
// the library's.
extern "C" int MPI_Allreduce(const void* send, void* receive, int count, MPI_Datatype type,
                             MPI_Op op, MPI_Comm comm) {
  allreduce_calls.fetch_add(1);
  return PMPI_Allreduce(send, receive, count, type, op, comm);
}

using namespace strata;
using native_hybrid = train::trainer<models::dlrm, embedding::sharded<optim::adagrad>,
                                     train::hybrid<ps::sync, mpi::native_allreduce>,
                                     compress::identity, mpi::transport>;
using ring_hybrid =
    train::trainer<models::dlrm, embedding::sharded<optim::adagrad>, train::hybrid<ps::sync>>;

TEST_CASE("hybrid with mpi::native_allreduce sums the dense gradients with MPI_Allreduce",
          "[mpi][trainer]") {
  if (mpi::environment::world_size() != 3) {
    strata_test::skip("the native-allreduce hybrid test needs 3 processes (2 workers + 1 server)");
    return;
  }
  const auto data = strata_test::make_data(1200, 11);
  const auto eval = strata_test::make_data(300, 12);
  optim::adagrad opt;
  opt.lr = 0.05f;
  auto options = strata_test::base_options(2, 16);
  options.servers = 1;
  options.deterministic = false;  // the library picks the summation order

  // Rank-ordered sums cannot be promised: refused with a sentence, on every rank.
  auto strict = options;
  strict.deterministic = true;
  REQUIRE_THROWS_WITH(native_hybrid(strata_test::small_dlrm(), opt, strict, 0),
                      Catch::Contains("set trainer_options::deterministic = false"));

  mpi::transport t({.timeout_seconds = 60});
  native_hybrid trainer(strata_test::small_dlrm(), opt, options, t.rank());
  const long before = allreduce_calls.load();
  const auto report = trainer.fit(t, data, &eval);
  const long calls = allreduce_calls.load() - before;
  const bool worker = t.rank() < 2;  // dedicated layout: workers first, then the server
  INFO("rank " << t.rank() << ": " << calls << " MPI_Allreduce calls");
  // One call per step on each worker (the dense count fits one call), none on the server.
  REQUIRE(calls == (worker ? static_cast<long>(options.max_steps) : 0));

  if (t.rank() != 0) return;
  REQUIRE(report.steps == options.max_steps);
  // The same run on threads with strata's ring: two workers' sums are one addition per value,
  // whichever library adds them, so the models agree bit for bit.
  ring_hybrid reference(strata_test::small_dlrm(), opt, options);
  const long ring_before = allreduce_calls.load();
  const auto expected = reference.fit(data, &eval);
  REQUIRE(allreduce_calls.load() == ring_before);  // the ring never calls MPI
  REQUIRE(report.dense_checksum == expected.dense_checksum);
  REQUIRE(trainer.dense_parameters() == reference.dense_parameters());
  REQUIRE(report.evals.back().auc == expected.evals.back().auc);
}

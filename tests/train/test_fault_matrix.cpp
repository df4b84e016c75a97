// The fault matrix of docs/reliability.md: for each strategy × phase × fault kind, a small
// training job with checkpoints either completes with the never-failed model (bitwise) or
// stops within the timeout with an error naming rank, peer and phase — and resuming from its
// last checkpoint without the fault gives the never-failed model, bitwise. The test writes
// the matrix as a markdown table (fault-matrix.md in its working directory) and compares it
// with the section of docs/reliability.md between the fault-matrix markers; with
// STRATA_UPDATE_DOCS=1 it rewrites that section instead.
#include <catch2/catch.hpp>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "strata/comm/fault.hpp"
#include "strata/core/timer.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/checkpoint_dir.hpp"
#include "strata/train/trainer.hpp"
#include "support/ctr_fixtures.hpp"

using namespace strata;
using comm::fault_kind;
using comm::phase;
using strata_test::base_options;
using strata_test::fresh_dir;
using strata_test::make_data;
using strata_test::small_dlrm;

namespace {

using allreduce_trainer =
    train::trainer<models::dlrm, embedding::local<optim::adagrad>, comm::ring_allreduce>;
using ps_sync_trainer = train::trainer<models::dlrm, embedding::sharded<optim::adagrad>,
                                       train::parameter_server<ps::sync>>;
using ps_async_trainer = train::trainer<models::dlrm, embedding::sharded<optim::adagrad, ps::async>,
                                        train::parameter_server<ps::async>>;
using hybrid_trainer =
    train::trainer<models::dlrm, embedding::sharded<optim::adagrad>, train::hybrid<ps::sync>>;

constexpr double timeout_seconds = 2.0;
constexpr double delay_seconds = 0.3;
constexpr std::size_t steps = 12, checkpoint_every = 4;

/// What a finished run leaves: the bits to compare.
struct model_bits {
  std::vector<float> dense;
  std::uint64_t dense_checksum = 0, embedding_checksum = 0;
  std::size_t first_step = 0, steps = 0, faults_fired = 0;
  [[nodiscard]] bool same_model(const model_bits& o) const {
    return dense == o.dense && dense_checksum == o.dense_checksum &&
           embedding_checksum == o.embedding_checksum && steps == o.steps;
  }
};

template <class Trainer>
model_bits train_with(const train::trainer_options& options, const data::ctr_dataset& data) {
  optim::adagrad opt;
  opt.lr = 0.05f;
  Trainer trainer(small_dlrm(), opt, options);
  const auto report = trainer.fit(data);
  return {trainer.dense_parameters(), report.dense_checksum, report.embedding_checksum,
          report.first_step,          report.steps,          report.faults_fired};
}

constexpr std::array<phase, 4> matrix_phases = {phase::pull, phase::push, phase::allreduce,
                                                phase::checkpoint};
constexpr std::array<fault_kind, 4> matrix_kinds = {fault_kind::drop, fault_kind::delay,
                                                    fault_kind::corrupt, fault_kind::kill};

/// One strategy of the matrix: how it trains, its world and which phases it has.
struct strategy {
  std::string name;
  std::string world;  ///< its ranks, for the table
  int workers = 2;
  int servers = 1;
  int fault_rank = 1;  ///< the rank whose send is hit
  std::array<bool, 4> has{};
  std::string missing;  ///< why the phases it lacks do not exist
  std::function<model_bits(const train::trainer_options&, const data::ctr_dataset&)> train;
};

std::vector<strategy> strategies() {
  return {
      {"allreduce",
       "2 workers",
       2,
       0,
       1,
       {false, false, true, true},
       "no servers: rows are all-gathered among the workers",
       &train_with<allreduce_trainer>},
      {"ps sync",
       "2 workers + 1 server (rank 2)",
       2,
       1,
       1,
       {true, true, false, true},
       "the dense part lives on the server",
       &train_with<ps_sync_trainer>},
      {"ps async",
       "1 worker + 1 server (rank 1)",
       1,
       1,
       0,
       {true, true, false, true},
       "the dense part lives on the server",
       &train_with<ps_async_trainer>},
      {"hybrid",
       "2 workers + 1 server (rank 2)",
       2,
       1,
       1,
       {true, true, true, true},
       "",
       &train_with<hybrid_trainer>},
  };
}

/// The n-th send of the phase that the fault hits: past the first checkpoint (step 4), so a
/// stopped run has a checkpoint to resume from. A step sends one pull and one push request
/// per table (and the dense rows under parameter_server); a checkpoint has three barriers of
/// ceil(log2 ranks) sends each: the fault hits the second checkpoint's first barrier (rank 0
/// made step-8.tmp/, no rank wrote its part yet). A fault at its second or third barrier may
/// stop the job before or after rank 0 publishes step 8 (both whole): the resumed step would
/// vary from run to run, and the table must not.
std::uint64_t nth_send(phase p, int ranks) {
  switch (p) {
    case phase::pull:
    case phase::push:
      return 30;
    case phase::allreduce:
      return 15;
    default: {
      const std::uint64_t rounds = ranks <= 2 ? 1 : 2;
      return 3 * rounds + 1;
    }
  }
}

train::trainer_options options_for(const strategy& s) {
  auto o = base_options(s.workers, 24 / static_cast<std::size_t>(s.workers));
  o.servers = s.servers;
  o.max_steps = steps;
  o.checkpoint_every = checkpoint_every;
  o.timeout_seconds = timeout_seconds;
  o.in_process_pulls = false;  // the reference pulls through messages, as the faulted runs do
  return o;
}

/// What the error names: rank, peer and phase.
struct named {
  std::string rank, peer, phase;
};
std::optional<named> parse_error(const std::string& what) {
  std::smatch m;
  named n;
  if (std::regex_search(what, m, std::regex("rank ([0-9]+): "))) n.rank = m[1];
  if (std::regex_search(what, m, std::regex("peer ([0-9]+)"))) n.peer = m[1];
  if (std::regex_search(what, m, std::regex("phase '([^']+)'"))) n.phase = m[1];
  if (n.rank.empty() || n.phase.empty()) return std::nullopt;
  return n;
}

std::string code_name(errc c) {
  switch (c) {
    case errc::timeout:
      return "timeout";
    case errc::bad_message:
      return "bad_message";
    case errc::aborted:
      return "aborted";
    default:
      return cat("errc ", static_cast<int>(c));
  }
}

/// The cell's text for the table, after checking it.
std::string run_cell(const strategy& s, phase p, fault_kind kind, const model_bits& reference,
                     const data::ctr_dataset& data) {
  auto options = options_for(s);
  const std::string cell_name =
      cat(s.name, "-", comm::phase_name(p), "-", comm::fault_kind_name(kind));
  INFO("cell " << cell_name);
  std::string dir_name = cell_name;
  std::replace(dir_name.begin(), dir_name.end(), ' ', '-');
  options.checkpoint_dir = fresh_dir("fault-matrix-" + dir_name);
  options.faults = {{.rank = s.fault_rank,
                     .kind = kind,
                     .when = p,
                     .nth = nth_send(p, s.workers + s.servers),
                     .delay_seconds = kind == fault_kind::delay ? delay_seconds : 0.0}};
  stopwatch watch;
  try {
    const model_bits got = s.train(options, data);
    // Completed: the fault must have acted, and the model is the never-failed one.
    REQUIRE(got.faults_fired == 1);
    REQUIRE(got.same_model(reference));
    return "completes, same model";
  } catch (const strata::error& e) {
    const double seconds = watch.seconds();
    INFO(e.what());
    // Stopped: within the timeout (a rank stalled in turn defers by at most one more), with
    // an error naming rank, peer and phase.
    REQUIRE(seconds < 2 * timeout_seconds + 1.0);
    const auto who = parse_error(e.what());
    REQUIRE(who.has_value());
    REQUIRE(!who->peer.empty());
    REQUIRE(kind != fault_kind::delay);  // a late message is never an error
    // Resume from the last checkpoint, without the fault: the never-failed model, bitwise.
    const auto steps_done = train::checkpoint_directory(options.checkpoint_dir).steps();
    REQUIRE(!steps_done.empty());
    options.faults.clear();
    options.resume = true;
    const model_bits resumed = s.train(options, data);
    REQUIRE(resumed.first_step == steps_done.back());
    REQUIRE(resumed.same_model(reference));
    return cat("stops: `", code_name(e.code()), "` rank ", who->rank, ", peer ", who->peer, ", '",
               who->phase, "'; resumed from step ", resumed.first_step, ": same model");
  }
}

std::filesystem::path docs_file() {
  // tests/train/test_fault_matrix.cpp → <repo>/docs/reliability.md
  // (__FILE__, not std::source_location: clang 14 with libstdc++ 12 has no source_location)
  const std::filesystem::path here = __FILE__;
  return here.parent_path().parent_path().parent_path() / "docs" / "reliability.md";
}

std::string read_all(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE(in.good());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

constexpr std::string_view begin_marker = "<!-- fault-matrix begin -->\n";
constexpr std::string_view end_marker = "<!-- fault-matrix end -->";

}  // namespace

TEST_CASE(
    "the fault matrix: every cell completes with the never-failed model or stops naming "
    "rank, peer and phase, and resumes to the never-failed model",
    "[train][faults]") {
  const auto data = make_data(2000, 3);
  std::ostringstream table;
  table << "| strategy (world) | phase | drop | delay " << delay_seconds
        << " s | corrupt | kill |\n|---|---|---|---|---|---|\n";
  for (const auto& s : strategies()) {
    INFO("strategy " << s.name);
    // The never-failed model: the same job, checkpoints and message pulls, no fault; trained
    // twice to show it is reproducible (what the cells are compared with).
    auto clean = options_for(s);
    clean.checkpoint_dir = fresh_dir("fault-matrix-reference");
    const model_bits reference = s.train(clean, data);
    clean.checkpoint_dir = fresh_dir("fault-matrix-reference");
    REQUIRE(s.train(clean, data).same_model(reference));
    REQUIRE(reference.steps == steps);
    for (std::size_t pi = 0; pi < matrix_phases.size(); ++pi) {
      const phase p = matrix_phases[pi];
      table << "| " << s.name << " (" << s.world << ") | " << comm::phase_name(p);
      if (!s.has[pi]) {
        table << " | — | — | — | — |\n";
        continue;
      }
      table << " (send " << nth_send(p, s.workers + s.servers) << " of rank " << s.fault_rank
            << ")";
      for (const fault_kind kind : matrix_kinds)
        table << " | " << run_cell(s, p, kind, reference, data);
      table << " |\n";
    }
  }
  table << "\n— : the phase does not exist under the strategy: allreduce has no servers (its "
           "row gradients are all-gathered among the workers, tag phase 'allgather'), so no pull "
           "and no push; under parameter_server the dense part lives on the servers (pulled "
           "and pushed with the rows), so no allreduce.\n";
  const std::string generated = table.str();
  { std::ofstream("fault-matrix.md", std::ios::trunc) << generated; }

  const auto doc = docs_file();
  std::string text = read_all(doc);
  const auto begin = text.find(begin_marker);
  const auto end = text.find(end_marker);
  REQUIRE(begin != std::string::npos);
  REQUIRE(end != std::string::npos);
  REQUIRE(begin < end);
  const auto body_begin = begin + begin_marker.size();
  const std::string committed = text.substr(body_begin, end - body_begin);
  const char* update = std::getenv("STRATA_UPDATE_DOCS");
  if (update != nullptr && std::string(update) == "1") {
    text.replace(body_begin, end - body_begin, generated);
    std::ofstream(doc, std::ios::binary | std::ios::trunc) << text;
    WARN("STRATA_UPDATE_DOCS=1: rewrote the fault matrix in " << doc.string());
  } else {
    INFO("the fault matrix of " << doc.string()
                                << " is out of date; the generated one is fault-matrix.md in "
                                   "the test's directory; run the test with "
                                   "STRATA_UPDATE_DOCS=1 to update the doc");
    REQUIRE(committed == generated);
  }
}

TEST_CASE("a bad fault plan in trainer_options is refused before training", "[train][faults]") {
  const auto data = make_data(200, 3);
  auto options = base_options(2, 12);
  options.servers = 1;
  options.faults = {{.rank = 3, .kind = fault_kind::kill}};
  optim::adagrad opt;
  REQUIRE_THROWS_WITH(hybrid_trainer(small_dlrm(), opt, options).fit(data),
                      Catch::Contains("rank 3 is outside the world of 3 ranks"));
  options.faults = {{.rank = 0, .kind = fault_kind::drop, .when = phase::push, .nth = 0}};
  REQUIRE_THROWS_WITH(hybrid_trainer(small_dlrm(), opt, options).fit(data),
                      Catch::Contains("n must be ≥ 1"));
  options.faults = {{.rank = 0, .kind = fault_kind::delay, .delay_seconds = -1}};
  REQUIRE_THROWS_WITH(hybrid_trainer(small_dlrm(), opt, options).fit(data),
                      Catch::Contains("delay must be finite and ≥ 0 s"));
}

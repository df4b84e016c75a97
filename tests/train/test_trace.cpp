// The timeline trace (core/trace.hpp, trainer_options::trace_file): the file is valid JSON in
// the Chrome / Perfetto trace event format, and a trained run's trace holds, per rank, the step
// phases as complete spans that follow each other, the evaluation and checkpoint spans and a
// counter of bytes sent that never decreases.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/trace.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/train/run_traces.hpp"
#include "strata/train/trainer.hpp"
#include "support/ctr_fixtures.hpp"
#include "support/json.hpp"
#include "support/temp_dir.hpp"

using namespace strata;
using strata_test::json;

namespace {

json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

/// The trace event format's required fields of every event (name, ph, pid, tid; ts for all but
/// metadata; dur ≥ 0 for complete events; args.value for counters).
void check_event_format(const json& event) {
  REQUIRE(event.type == json::kind::object);
  const json* name = event.find("name");
  const json* ph = event.find("ph");
  REQUIRE(name != nullptr);
  REQUIRE(name->type == json::kind::string);
  REQUIRE(ph != nullptr);
  REQUIRE(ph->type == json::kind::string);
  REQUIRE(event.find("pid") != nullptr);
  REQUIRE(event.find("tid") != nullptr);
  const std::set<std::string> phases = {"X", "C", "M", "i"};
  REQUIRE(phases.contains(ph->text));
  if (ph->text != "M") {
    REQUIRE(event.find("ts") != nullptr);
    REQUIRE(event.find("ts")->type == json::kind::number);
  }
  if (ph->text == "X") {
    REQUIRE(event.find("dur") != nullptr);
    CHECK(event.find("dur")->number >= 0);
  }
  if (ph->text == "C") {
    const json* args = event.find("args");
    REQUIRE(args != nullptr);
    REQUIRE(args->find("value") != nullptr);
  }
}

}  // namespace

TEST_CASE("write_trace writes the trace event format: tracks, spans, counters, escaped names",
          "[core][trace]") {
  const strata_test::temp_dir tmp("trace");
  trace_recorder a(0, "worker \"0\"\n"), b(3, "server 1");
  const auto t0 = trace_recorder::clock::now();
  a.span("compute", t0, t0 + std::chrono::microseconds(250));
  a.count("MiB sent", 1.5, t0 + std::chrono::microseconds(300));
  b.span("checkpoint", t0, t0 + std::chrono::milliseconds(2));
  trace_recorder small(4, "full", 2);
  for (int i = 0; i < 5; ++i)
    small.span("pull", t0, t0);
  CHECK(small.events().size() == 2);
  CHECK(small.dropped() == 3);
  CHECK_THROWS_WITH(trace_recorder(5, "none", 0), Catch::Contains("capacity must be positive"));
  CHECK(hex16(0x1234) == "0000000000001234");  // the run id's form in the resume line
  const std::vector<const trace_recorder*> tracks = {&a, &b, &small};
  write_trace(tmp.path / "t.json", tracks);

  const json doc = read_json(tmp.path / "t.json");
  REQUIRE(doc.find("traceEvents") != nullptr);
  const auto& events = doc.find("traceEvents")->items;
  std::map<std::string, int> names;
  for (const auto& e : events) {
    check_event_format(e);
    ++names[e.find("name")->text];
  }
  CHECK(names["thread_name"] == 3);
  CHECK(names["compute"] == 1);
  CHECK(names["pull"] == 2);
  CHECK(names["events dropped (trace buffer full)"] == 1);
  for (const auto& e : events) {
    if (e.find("name")->text == "thread_name" && e.find("tid")->number == 0)
      CHECK(e.find("args")->find("name")->text == "worker \"0\"\n");  // escaped and read back
    if (e.find("name")->text == "compute") CHECK(e.find("dur")->number == Approx(250.0));
    if (e.find("name")->text == "checkpoint") CHECK(e.find("tid")->number == 3);
  }
  CHECK_THROWS_WITH(write_trace(tmp.path / "missing" / "t.json", tracks),
                    Catch::Contains("cannot write"));
}

TEST_CASE("run_traces: off without a file, a track per rank, a file per process rank",
          "[train][trace]") {
  const strata_test::temp_dir tmp("run_traces");
  const train::run_traces off({}, 2);
  CHECK_FALSE(off.on());
  CHECK(off.at(1) == nullptr);
  bool ran = false;
  off.span(1, "eval", [&] { ran = true; });  // runs the work, records nothing
  CHECK(ran);
  off.check_writable(0);
  off.write_all();  // writes nothing
  CHECK(std::filesystem::is_empty(tmp.path));

  train::run_traces traces(tmp.path / "run.json", 3);
  CHECK(traces.on());
  CHECK(traces.path(-1) == tmp.path / "run.json");
  CHECK(traces.path(2) == tmp.path / "run.rank2.json");
  REQUIRE(traces.start(0, "worker 0") != nullptr);
  REQUIRE(traces.start(2, "server 0/1") != nullptr);
  CHECK(traces.at(1) == nullptr);  // not started: its spans are not recorded
  traces.span(0, "checkpoint", [] {});
  traces.span(1, "eval", [] {});
  REQUIRE(traces.at(0)->events().size() == 1);
  CHECK(std::string(traces.at(0)->events()[0].name) == "checkpoint");
  traces.write_all();
  traces.write_rank(2);
  std::map<std::string, int> names;
  const json whole = read_json(tmp.path / "run.json");
  for (const auto& e : whole.find("traceEvents")->items)
    ++names[e.find("name")->text];
  CHECK(names["thread_name"] == 2);
  CHECK(names["checkpoint"] == 1);
  CHECK(names["eval"] == 0);
  const json rank2 = read_json(tmp.path / "run.rank2.json");
  CHECK(rank2.find("traceEvents")->items.size() == 2);  // process and thread names

  const train::run_traces nowhere(tmp.path / "missing" / "run.json", 1);
  CHECK_THROWS_WITH(nowhere.check_writable(0), Catch::Contains("cannot write the trace file"));
  CHECK_THROWS_WITH(nowhere.check_writable(0), Catch::Contains("run.rank0.json"));
}

TEST_CASE(
    "a trained run's trace: each worker's phases in order, eval and checkpoint spans, "
    "bytes sent never decreasing",
    "[train][trace]") {
  const strata_test::temp_dir tmp("trainer_trace");
  const auto data = strata_test::make_data(2000, 17);
  auto options = strata_test::base_options(2, 32);
  options.servers = 1;
  options.max_steps = 12;
  options.eval_every = 6;
  options.checkpoint_dir = tmp.path / "ckpt";
  options.checkpoint_every = 6;
  options.trace_file = tmp.path / "run.json";
  train::trainer<models::dlrm, embedding::sharded<optim::adagrad>, train::hybrid<ps::sync>> trainer(
      strata_test::small_dlrm(), optim::adagrad{}, options);
  const auto report = trainer.fit(data, &data);
  REQUIRE(report.steps == 12);

  const json doc = read_json(options.trace_file);
  const auto& events = doc.find("traceEvents")->items;
  std::map<int, std::string> track_names;
  std::map<int, std::vector<const json*>> spans;  // per track, in file order
  std::map<int, std::vector<double>> sent;
  for (const auto& e : events) {
    check_event_format(e);
    const int tid = static_cast<int>(e.find("tid")->number);
    const std::string& ph = e.find("ph")->text;
    if (e.find("name")->text == "thread_name")
      track_names[tid] = e.find("args")->find("name")->text;
    if (ph == "X") spans[tid].push_back(&e);
    if (ph == "C") sent[tid].push_back(e.find("args")->find("value")->number);
  }
  CHECK(track_names[0] == "worker 0");
  CHECK(track_names[1] == "worker 1");
  CHECK(track_names[2] == "server 0/1");  // the dedicated server rank

  const std::set<std::string> allowed = {"data", "pull", "compute",   "allreduce",
                                         "push", "eval", "checkpoint"};
  for (int w = 0; w < 2; ++w) {
    INFO("worker " << w);
    std::map<std::string, int> count;
    double last_end = -1e300;
    for (const json* e : spans[w]) {
      const std::string& name = e->find("name")->text;
      CHECK(allowed.contains(name));
      ++count[name];
      // A worker's spans follow each other: each starts where (or after) the previous ended.
      const double start = e->find("ts")->number, end = start + e->find("dur")->number;
      CHECK(start >= last_end - 0.002);  // the file rounds to nanoseconds
      last_end = end;
    }
    CHECK(count["compute"] >= 12);  // forward/backward and the dense update: per step
    CHECK(count["push"] == 12);
    CHECK(count["allreduce"] == 12);
    CHECK(count["checkpoint"] == 2);  // steps 6 and 12
    CHECK(count["eval"] == (w == 0 ? 2 : 0));
    REQUIRE(sent[w].size() == 12);
    for (std::size_t i = 1; i < sent[w].size(); ++i)
      CHECK(sent[w][i] >= sent[w][i - 1]);
    CHECK(sent[w].back() > 0);
  }
  std::map<std::string, int> server;
  for (const json* e : spans[2])
    ++server[e->find("name")->text];
  CHECK(server["checkpoint"] == 2);

  // A trace file that cannot be written is refused before training.
  auto bad = options;
  bad.trace_file = tmp.path / "no-such-dir" / "run.json";
  bad.checkpoint_dir.clear();
  train::trainer<models::dlrm, embedding::sharded<optim::adagrad>, train::hybrid<ps::sync>> refused(
      strata_test::small_dlrm(), optim::adagrad{}, bad);
  CHECK_THROWS_WITH(refused.fit(data), Catch::Contains("cannot write the trace file"));
}

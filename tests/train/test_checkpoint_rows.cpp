// What a checkpoint holds, on its own: the run's identity (checkpoint_meta), rows as
// placement-free records (row_records, read_row_records), and the dense and sparse paths'
// checkpoint hooks (rows with optimizer state, residuals), each against what was written.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "strata/comm/thread_world.hpp"
#include "strata/compress/error_feedback.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/embedding/local.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/adam.hpp"
#include "strata/train/checkpoint_rows.hpp"
#include "strata/train/dense_path.hpp"
#include "strata/train/sparse_path.hpp"
#include "support/ctr_fixtures.hpp"

using namespace strata;
using strata_test::fresh_dir;

namespace {
train::checkpoint_meta sample_meta() {
  return {.step = 42,
          .dense_count = 1001,
          .dense_row = 64,
          .seed = 7,
          .workers = 3,
          .optimizer = "adagrad",
          .dense_optimizer = "adam",
          .strategy = "hybrid",
          .tables = "C1 1000 16\nC2 500 16\n",
          .files = {"rows-worker-0.ckpt", "worker-0.ckpt", "rows-server-0.ckpt"},
          .seals = {},
          .run_id = 0};
}
std::vector<float> values(std::size_t n, float base) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = base + 0.25f * static_cast<float>(i);
  return v;
}
}  // namespace

TEST_CASE("checkpoint_meta round-trips and refuses another model or other optimizers",
          "[train][checkpoint]") {
  const auto dir = fresh_dir("meta");
  std::filesystem::create_directories(dir);
  const auto meta = sample_meta();
  meta.write(dir / "state.ckpt");
  const auto back = train::checkpoint_meta::read(dir / "state.ckpt");
  CHECK(back.step == 42);
  CHECK(back.dense_count == 1001);
  CHECK(back.dense_row == 64);
  CHECK(back.seed == 7);
  CHECK(back.workers == 3);
  CHECK(back.optimizer == "adagrad");
  CHECK(back.dense_optimizer == "adam");
  CHECK(back.strategy == "hybrid");
  CHECK(back.files == meta.files);
  CHECK(back.tables == meta.tables);
  // The listed files must all be there, and no unlisted rows/worker file.
  CHECK_THROWS_WITH(back.check_complete(dir), Catch::Contains("is incomplete: rows-worker-0.ckpt"));
  for (const auto& name : meta.files)
    std::ofstream(dir / name) << "x";
  CHECK_NOTHROW(back.check_complete(dir));
  std::ofstream(dir / "worker-5.ckpt") << "x";
  CHECK_THROWS_WITH(back.check_complete(dir),
                    Catch::Contains("worker-5.ckpt") && Catch::Contains("does not list"));
  std::filesystem::remove(dir / "worker-5.ckpt");
  // A meta without a file list (older checkpoints) checks nothing.
  auto old = back;
  old.files.clear();
  std::filesystem::remove(dir / "worker-0.ckpt");
  CHECK_NOTHROW(old.check_complete(dir));

  // Another strategy and worker count resume; another model, seed, table or optimizer does not.
  auto run = meta;
  run.strategy = "allreduce";
  run.workers = 8;
  CHECK_NOTHROW(back.check_resumable_as(run, dir));
  run = meta;
  run.seed = 1;
  CHECK_THROWS_WITH(back.check_resumable_as(run, dir),
                    Catch::Contains("written by a run with seed 7; this run has seed 1") &&
                        Catch::Contains("resume with seed 7"));
  run = meta;
  run.tables = "C1 1000 16\nC2 501 16\n";
  CHECK_THROWS_WITH(back.check_resumable_as(run, dir),
                    Catch::Contains("table 2 was 'C2 500 16' (name rows dim) and is 'C2 501 16'"));
  run = meta;
  run.tables.clear();  // a checkpoint or run without the record checks nothing of it
  CHECK_NOTHROW(back.check_resumable_as(run, dir));
  run = meta;
  run.dense_count = 1002;
  CHECK_THROWS_WITH(back.check_resumable_as(run, dir),
                    Catch::Contains("holds 1001 dense parameters but this model has 1002"));
  run = meta;
  run.dense_optimizer = "sgd";
  CHECK_THROWS_WITH(back.check_resumable_as(run, dir),
                    Catch::Contains("written with optimizers adagrad (tables) and adam (dense)") &&
                        Catch::Contains("resume with the optimizers it was written with"));
  run = meta;
  run.dense_row = 32;
  CHECK_THROWS_AS(back.check_resumable_as(run, dir), strata::error);
}

// Found by tests/fuzz/fuzz_checkpoint (corpus/checkpoint/regress-duplicate-section): a file
// naming a section twice, with a right checksum, was accepted and its second copy silently won.
TEST_CASE("a checkpoint naming a section twice is refused", "[train][checkpoint]") {
  const auto dir = fresh_dir("duplicate");
  std::filesystem::create_directories(dir);
  std::vector<std::byte> file;
  const auto put = [&](const void* data, std::size_t size) {
    const auto* p = static_cast<const std::byte*>(data);
    file.insert(file.end(), p, p + size);
  };
  put("STRATACK", 8);
  const std::uint32_t version = 1, sections = 2, name_size = 9;
  put(&version, 4);
  put(&sections, 4);
  for (const std::uint64_t step : {42u, 43u}) {
    const std::uint64_t size = 8;
    put(&name_size, 4);
    put("meta/step", name_size);
    put(&size, 8);
    put(&step, 8);
  }
  train::detail::checksum64 sum;
  sum.update(file);
  const std::uint64_t checksum = sum.value();
  put(&checksum, 8);
  const auto path = dir / "state.ckpt";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
  for (const auto& read :
       std::vector<std::function<void()>>{[&] { (void)train::checkpoint_reader(path); },
                                          [&] { (void)train::checkpoint_meta::read(path); }}) {
    try {
      read();
      FAIL("no exception");
    } catch (const strata::error& e) {
      CHECK(e.code() == errc::corrupt_data);
      CHECK_THAT(e.what(), Catch::Contains(path.string()) &&
                               Catch::Contains("section 'meta/step' appears twice"));
    }
  }
}

TEST_CASE("row_records written by several holders read back as every record, shapes checked",
          "[train][checkpoint]") {
  const auto dir = fresh_dir("rows");
  std::filesystem::create_directories(dir);
  // Two tables: dim 3 with 1 state float, dim 2 with 4 state floats; two holders.
  const std::vector<train::row_shape> shapes{{3, 1}, {2, 4}};
  std::map<std::tuple<std::size_t, std::uint64_t>, std::vector<float>> written;
  for (int holder = 0; holder < 2; ++holder) {
    train::row_records records(2);
    auto add = records.adder();
    for (std::uint64_t key = static_cast<std::uint64_t>(holder); key < 9; key += 2) {
      for (std::size_t t = 0; t < 2; ++t) {
        const auto row = values(shapes[t].dim, static_cast<float>(key * 10 + t));
        const auto state = values(shapes[t].state_floats, -static_cast<float>(key));
        add(t, key, row, state);
        auto all = row;
        all.insert(all.end(), state.begin(), state.end());
        written[{t, key}] = all;
      }
    }
    CHECK(records.rows(0) == (holder == 0 ? 5u : 4u));
    records.commit(dir / ("rows-holder-" + std::to_string(holder) + ".ckpt"));
  }
  std::map<std::tuple<std::size_t, std::uint64_t>, std::vector<float>> read;
  train::read_row_records(dir, shapes,
                          [&](std::size_t t, std::uint64_t key, std::span<const float> row,
                              std::span<const float> state, const std::filesystem::path& file) {
                            CHECK(file.filename().string().rfind("rows-holder-", 0) == 0);
                            std::vector<float> all(row.begin(), row.end());
                            all.insert(all.end(), state.begin(), state.end());
                            CHECK(read.emplace(std::tuple(t, key), all).second);
                          });
  CHECK(read == written);

  const auto ignore = [](auto&&...) {};
  // A model whose second table has dim 4: the rows section has the wrong size.
  const std::vector<train::row_shape> wider{{3, 1}, {4, 4}};
  CHECK_THROWS_WITH(train::read_row_records(dir, wider, ignore),
                    Catch::Contains("t1/rows") && Catch::Contains("another model configuration"));
  // A model with a third table.
  const std::vector<train::row_shape> more{{3, 1}, {2, 4}, {1, 0}};
  CHECK_THROWS_WITH(train::read_row_records(dir, more, ignore),
                    Catch::Contains("has 1 embedding tables but the model has 2"));
  // A checkpoint without rows files.
  const auto empty = fresh_dir("rows-none");
  std::filesystem::create_directories(empty);
  CHECK_THROWS_WITH(train::read_row_records(empty, shapes, ignore),
                    Catch::Contains("has no rows-*.ckpt files"));
  train::row_records records(2);
  CHECK_THROWS_WITH(records.add(2, 0, {}, {}), Catch::Contains("table 2 of 2"));
}

TEST_CASE("allreduce_dense saves its replica rows with optimizer state and loads them back",
          "[train][checkpoint][dense_path]") {
  const std::size_t count = 10, row = 4;  // 3 rows, the last one padded
  optim::adam adam;
  adam.lr = 0.01f;
  using path_type = train::allreduce_dense<compress::identity, optim::adam>;
  path_type trained(train::dense_rows(count, row), adam, true);
  auto params = values(count, 0.5f);
  const auto grads = values(count, -1.0f);
  trained.apply(params, grads);
  trained.apply(params, grads);

  train::row_records records(2);
  trained.save_rows(params, 1, records.adder());
  REQUIRE(records.rows(0) == 0);
  REQUIRE(records.rows(1) == 3);
  const auto dir = fresh_dir("dense-rows");
  std::filesystem::create_directories(dir);
  records.commit(dir / "rows-worker-0.ckpt");

  path_type loaded(train::dense_rows(count, row), adam, true);
  std::vector<float> loaded_params(count, 0.0f);
  const std::vector<train::row_shape> shapes{{8, 0}, {row, optim::adam::state_floats(row)}};
  train::read_row_records(
      dir, shapes, [&](std::size_t t, std::uint64_t r, auto values_row, auto state, const auto&) {
        REQUIRE(t == 1);
        loaded.load_row(loaded_params, r, values_row, state);
      });
  CHECK(loaded_params == params);
  CHECK(std::vector<float>(loaded.state().begin(), loaded.state().end()) ==
        std::vector<float>(trained.state().begin(), trained.state().end()));
  // Both continue identically.
  trained.apply(params, grads);
  loaded.apply(loaded_params, grads);
  CHECK(loaded_params == params);
  const std::vector<float> wrong_state(3);
  CHECK_THROWS_WITH(loaded.load_row(loaded_params, 0, values(row, 0), wrong_state),
                    Catch::Contains("3 state values"));
}

TEST_CASE("allreduce_dense's residual travels through a worker's checkpoint file",
          "[train][checkpoint][dense_path]") {
  using codec = compress::error_feedback<compress::int8_block<64>>;
  using path_type = train::allreduce_dense<codec, optim::adagrad>;
  static_assert(path_type::has_residual);
  const std::size_t count = 300;
  const auto dir = fresh_dir("dense-residual");
  std::filesystem::create_directories(dir);
  // Two workers sum once through int8 (residuals become non-zero), save, and a fresh pair
  // that loads them sums the next gradients exactly as the originals do.
  std::vector<std::vector<float>> continued(2), restored(2);
  const auto grads_of = [&](int rank, int step) {
    std::vector<float> g(count);
    for (std::size_t i = 0; i < count; ++i)
      g[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + rank + 3 * step));
    return g;
  };
  comm::thread_world world(2, {.timeout_seconds = 20});
  world.run([&](comm::thread_transport& t) {
    path_type path(train::dense_rows(count, 16), optim::adagrad{}, true);
    auto g = grads_of(t.rank(), 0);
    path.sum(t, std::span(g));
    train::checkpoint_writer out;
    path.save_residual(out);
    out.commit(dir / ("worker-" + std::to_string(t.rank()) + ".ckpt"));
    g = grads_of(t.rank(), 1);
    path.sum(t, std::span(g));
    continued[static_cast<std::size_t>(t.rank())] = g;
  });
  world.run([&](comm::thread_transport& t) {
    path_type path(train::dense_rows(count, 16), optim::adagrad{}, true);
    const train::checkpoint_reader in(dir / ("worker-" + std::to_string(t.rank()) + ".ckpt"));
    path.load_residual(&in);
    auto g = grads_of(t.rank(), 1);
    path.sum(t, std::span(g));
    restored[static_cast<std::size_t>(t.rank())] = g;
  });
  CHECK(restored == continued);
  // Without a file the residual is forgotten: the next sum differs.
  world.run([&](comm::thread_transport& t) {
    path_type path(train::dense_rows(count, 16), optim::adagrad{}, true);
    path.load_residual(nullptr);
    auto g = grads_of(t.rank(), 1);
    path.sum(t, std::span(g));
    restored[static_cast<std::size_t>(t.rank())] = g;
  });
  CHECK(restored != continued);
}

TEST_CASE("replicated_rows saves every table's rows and loads them into a fresh replica",
          "[train][checkpoint][sparse_path]") {
  const std::vector<embedding::table_spec> tables{{"a", 20, 4}, {"b", 7, 2}};
  optim::adagrad opt;
  opt.lr = 0.1f;
  using path_type = train::replicated_rows<embedding::local<optim::adagrad>>;
  path_type trained(tables, opt, embedding::uniform_init{.seed = 3});
  const std::vector<std::uint64_t> keys_a{1, 5, 5, 19}, keys_b{0, 6};
  matrix<float> grads_a(4, 4), grads_b(2, 2);
  for (std::size_t i = 0; i < 16; ++i)
    grads_a.flat()[i] = 0.1f * static_cast<float>(i) - 0.7f;
  for (std::size_t i = 0; i < 4; ++i)
    grads_b.flat()[i] = 0.3f * static_cast<float>(i) + 0.1f;
  const std::vector<ps::table_push> pushes{{0, keys_a, grads_a.view()},
                                           {1, keys_b, grads_b.view()}};
  comm::thread_world one(1, {.timeout_seconds = 20});
  one.run([&](comm::thread_transport& t) { trained.apply(t, pushes); });

  const auto dir = fresh_dir("replica-rows");
  std::filesystem::create_directories(dir);
  train::row_records records(2);
  trained.save_rows(2, records.adder());
  CHECK(records.rows(0) == 20);  // a local table holds every row
  CHECK(records.rows(1) == 7);
  records.commit(dir / "rows-worker-0.ckpt");

  path_type fresh(tables, opt, embedding::uniform_init{.seed = 99});
  const std::vector<train::row_shape> shapes{{4, optim::adagrad::state_floats(4)},
                                             {2, optim::adagrad::state_floats(2)}};
  train::read_row_records(dir, shapes,
                          [&](std::size_t t, std::uint64_t key, auto row, auto state, const auto&) {
                            fresh.load_row(t, key, row, state);
                          });
  for (std::size_t t = 0; t < 2; ++t)
    for (std::uint64_t key = 0; key < tables[t].rows; ++key) {
      const auto want = trained.storage().row(t, key);
      const auto got = fresh.storage().row(t, key);
      CHECK(std::vector<float>(got.begin(), got.end()) ==
            std::vector<float>(want.begin(), want.end()));
      const auto want_state = trained.storage().state(t, key);
      const auto got_state = fresh.storage().state(t, key);
      CHECK(std::vector<float>(got_state.begin(), got_state.end()) ==
            std::vector<float>(want_state.begin(), want_state.end()));
    }
  CHECK_THROWS_WITH(fresh.load_row(1, 0, values(4, 0), values(1, 0)),
                    Catch::Contains("row of 4 + 1 state values"));
}

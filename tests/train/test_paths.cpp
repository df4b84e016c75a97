// The trainer's two acting parts on their own: the dense path (dense_rows, allreduce_dense,
// servers_dense) and the sparse path (replicated_rows), each against a naive reference.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <mutex>
#include <vector>

#include "strata/comm/thread_world.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/embedding/local.hpp"
#include "strata/optim/adam.hpp"
#include "strata/optim/sgd.hpp"
#include "strata/train/dense_path.hpp"
#include "strata/train/sparse_path.hpp"
#include "support/ensure.hpp"

using namespace strata;

namespace {
float grad_value(int rank, std::size_t i) {
  return static_cast<float>(std::sin(0.91 * static_cast<double>(i) + 1.3 * rank) * (1 + rank));
}
}  // namespace

TEST_CASE("dense_rows pads the last row with zeros and writes back only real values",
          "[train][dense_path]") {
  const train::dense_rows layout(10, 4);
  REQUIRE(layout.rows() == 3);
  REQUIRE(layout.full_rows() == 2);
  std::vector<float> params(10);
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i] = static_cast<float>(i + 1);
  std::vector<float> row(4, -1.0f);
  layout.read(params, 2, row);
  REQUIRE(row == std::vector<float>{9, 10, 0, 0});
  row = {90, 100, 7, 7};
  layout.write(params, 2, row);
  REQUIRE(params[8] == 90);
  REQUIRE(params[9] == 100);
  matrix<float> all(3, 4);
  layout.read_all(params, all.view());
  REQUIRE(all(0, 0) == 1);
  REQUIRE(all(2, 1) == 100);
  REQUIRE(all(2, 2) == 0);
  REQUIRE(all(2, 3) == 0);
  REQUIRE_THROWS_WITH(layout.read(params, 3, row), Catch::Contains("row 3 of 3"));
  std::vector<float> short_row(3);
  REQUIRE_THROWS_AS(layout.write(params, 0, short_row), strata::error);
  REQUIRE_THROWS_WITH(train::dense_rows(5, 0), Catch::Contains("must be ≥ 1"));
}

TEST_CASE("allreduce_dense sums like a serial rank-order loop (bitwise when deterministic)",
          "[train][dense_path]") {
  const std::size_t count = 1003;
  for (bool deterministic : {true, false}) {
    comm::thread_world world(3, {.timeout_seconds = 20});
    REQUIRE_NOTHROW(world.run([&](comm::thread_transport& t) {
      train::allreduce_dense<compress::identity, optim::sgd> path(train::dense_rows(count, 64),
                                                                  optim::sgd{}, deterministic);
      std::vector<float> grads(count);
      for (std::size_t i = 0; i < count; ++i)
        grads[i] = grad_value(t.rank(), i);
      path.sum(t, std::span(grads));
      for (std::size_t i = 0; i < count; ++i) {
        const float serial = (grad_value(0, i) + grad_value(1, i)) + grad_value(2, i);
        if (deterministic)
          strata_test::ensure(grads[i] == serial, "value ", i, ": ", grads[i], " != ", serial);
        else
          strata_test::ensure(std::abs(grads[i] - serial) <= 1e-5, "value ", i, ": ", grads[i],
                              " vs ", serial);
      }
    }));
  }
}

namespace {
/// An Allreduce policy that counts its calls through the pointer it was built with (so a test
/// sees whether the path used the instance it was given) and sums with strata's ring.
struct counting_allreduce {
  static constexpr const char* name = "counting_allreduce";
  std::atomic<int>* calls = nullptr;
  template <comm::transport T, class V>
  void operator()(T& t, std::span<V> data) const {
    calls->fetch_add(1);
    comm::allreduce(t, data);
  }
};
}  // namespace

TEST_CASE("allreduce_dense uses the Allreduce it is given, with its options",
          "[train][dense_path]") {
  const std::size_t count = 1003;
  // The ring's chunk: any chunk gives the same sums (each value's order of additions is its
  // segment's), lossless and through fp16; a chunk that holds no float is refused up front.
  const auto summed = [&]<class C>(C, comm::ring_allreduce ring, bool deterministic) {
    std::vector<float> out(count);
    comm::thread_world world(3, {.timeout_seconds = 20});
    world.run([&](comm::thread_transport& t) {
      train::allreduce_dense<C, optim::sgd> path(train::dense_rows(count, 64), optim::sgd{},
                                                 deterministic, ring);
      std::vector<float> grads(count);
      for (std::size_t i = 0; i < count; ++i)
        grads[i] = grad_value(t.rank(), i);
      path.sum(t, std::span(grads));
      if (t.rank() == 1) out = grads;
    });
    return out;
  };
  for (bool deterministic : {false, true}) {
    const auto whole = summed(compress::identity{}, {}, deterministic);
    CHECK(summed(compress::identity{}, {.chunk_bytes = 40}, deterministic) == whole);
    CHECK(summed(compress::identity{}, {.chunk_bytes = 4}, deterministic) == whole);
  }
  const auto fp16_whole = summed(compress::fp16{}, {}, false);
  CHECK(summed(compress::fp16{}, {.chunk_bytes = 40}, false) == fp16_whole);
  REQUIRE_THROWS_WITH((train::allreduce_dense<compress::identity, optim::sgd>(
                          train::dense_rows(count, 64), optim::sgd{}, false,
                          comm::ring_allreduce{.chunk_bytes = 2})),
                      Catch::Contains("chunk_bytes is 2"));
  // Another Allreduce: the path calls the instance it holds, once per sum.
  std::atomic<int> calls{0};
  comm::thread_world world(2, {.timeout_seconds = 20});
  world.run([&](comm::thread_transport& t) {
    train::allreduce_dense<compress::identity, optim::sgd, counting_allreduce> path(
        train::dense_rows(count, 64), optim::sgd{}, false, counting_allreduce{&calls});
    std::vector<float> grads(count, 1.0f);
    path.sum(t, std::span(grads));
    path.sum(t, std::span(grads));
    strata_test::ensure(grads[7] == 4.0f, "two sums over two ranks of 1: ", grads[7]);
  });
  CHECK(calls.load() == 4);  // 2 ranks × 2 sums
  REQUIRE_THROWS_WITH((train::allreduce_dense<compress::identity, optim::sgd, counting_allreduce>(
                          train::dense_rows(count, 64), optim::sgd{}, true, {&calls})),
                      Catch::Contains("cannot give rank-ordered"));
}

TEST_CASE("allreduce_dense sums statistics in float64, lossless whatever the compressor",
          "[train][dense_path]") {
  // Batch norm's per-channel sums: exact rank-order sums when deterministic, the ring's (equal
  // to the naive sum up to rounding) otherwise; fp16 on the gradients never touches them.
  std::vector<std::vector<double>> inputs(3, std::vector<double>(9));  // computed once
  for (std::size_t r = 0; r < 3; ++r)
    for (std::size_t i = 0; i < 9; ++i)
      inputs[r][i] = std::cos(0.3 * static_cast<double>(i) - static_cast<double>(r)) *
                     (1 + static_cast<double>(r) * 1e7);
  for (bool deterministic : {false, true}) {
    comm::thread_world world(3, {.timeout_seconds = 20});
    REQUIRE_NOTHROW(world.run([&](comm::thread_transport& t) {
      train::allreduce_dense<compress::fp16, optim::sgd> path(train::dense_rows(10, 4),
                                                              optim::sgd{}, deterministic);
      std::vector<double> sums = inputs[static_cast<std::size_t>(t.rank())];
      path.sum_statistics(t, std::span(sums));
      for (std::size_t i = 0; i < sums.size(); ++i) {
        const double expected = (inputs[0][i] + inputs[1][i]) + inputs[2][i];
        if (deterministic)
          strata_test::ensure(sums[i] == expected, "value ", i, ": ", sums[i], " != ", expected);
        else  // the ring's order: float64 rounding of a 3e7 magnitude, far below fp16's
          strata_test::ensure(std::abs(sums[i] - expected) <= 1e-8, "value ", i);
      }
    }));
  }
  std::atomic<int> calls{0};
  comm::thread_world world(2, {.timeout_seconds = 20});
  world.run([&](comm::thread_transport& t) {
    train::allreduce_dense<compress::identity, optim::sgd, counting_allreduce> path(
        train::dense_rows(8, 4), optim::sgd{}, false, counting_allreduce{&calls});
    std::vector<double> sums(3, 0.5);
    path.sum_statistics(t, std::span(sums));
    strata_test::ensure(sums[2] == 1.0, "two ranks of 0.5: ", sums[2]);
  });
  REQUIRE(calls.load() == 2);  // the foreign Allreduce sums the statistics too
}

TEST_CASE("allreduce_dense through fp16 stays within fp16 rounding of the float64 sum",
          "[train][dense_path]") {
  const std::size_t count = 500;
  comm::thread_world world(2, {.timeout_seconds = 20});
  REQUIRE_NOTHROW(world.run([&](comm::thread_transport& t) {
    train::allreduce_dense<compress::fp16, optim::sgd> path(train::dense_rows(count, 64),
                                                            optim::sgd{}, true);
    strata_test::ensure(path.residual().empty(), "fp16 keeps no residual");
    std::vector<float> grads(count);
    for (std::size_t i = 0; i < count; ++i)
      grads[i] = grad_value(t.rank(), i);
    path.sum(t, std::span(grads));
    for (std::size_t i = 0; i < count; ++i) {
      const double exact = double(grad_value(0, i)) + double(grad_value(1, i));
      strata_test::ensure(std::abs(grads[i] - exact) <= 4e-3 * (1 + std::abs(exact)), "value ", i,
                          ": ", grads[i], " vs ", exact);
    }
  }));
}

TEST_CASE("allreduce_dense applies the optimizer row by row, the padded last row included",
          "[train][dense_path]") {
  const std::size_t count = 10, row = 4;
  optim::adam adam;
  adam.lr = 0.01f;
  train::allreduce_dense<compress::identity, optim::adam> path(train::dense_rows(count, row), adam,
                                                               true);
  REQUIRE(path.state().size() == 3 * optim::adam::state_floats(row));
  std::vector<float> params(count), grads(count);
  for (std::size_t i = 0; i < count; ++i) {
    params[i] = 0.1f * static_cast<float>(i);
    grads[i] = grad_value(0, i);
  }
  // Reference: the optimizer on each zero-padded row of its own state.
  std::vector<float> expected = params;
  std::vector<float> state(3 * optim::adam::state_floats(row), 0.0f);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t r = 0; r < 3; ++r) {
      std::vector<float> p(row, 0.0f), g(row, 0.0f);
      for (std::size_t c = 0; c < row && r * row + c < count; ++c) {
        p[c] = expected[r * row + c];
        g[c] = grads[r * row + c];
      }
      const std::size_t sf = optim::adam::state_floats(row);
      adam.apply(p, std::span(state).subspan(r * sf, sf), g);
      for (std::size_t c = 0; c < row && r * row + c < count; ++c)
        expected[r * row + c] = p[c];
    }
    path.apply(params, grads);
  }
  REQUIRE(params == expected);
  REQUIRE(std::vector<float>(path.state().begin(), path.state().end()) == state);
  std::vector<float> wrong(count + 1);
  REQUIRE_THROWS_WITH(path.apply(wrong, grads), Catch::Contains("11 parameters"));
  std::vector<float> residual(count, 1.0f);
  REQUIRE_THROWS_WITH(path.restore_residual(residual), Catch::Contains("keeps no residual"));
}

namespace {
/// Records what a dense path pushes (the PS storage's apply_gradients).
struct recording_storage {
  std::size_t table = 99;
  std::vector<std::uint64_t> keys;
  std::vector<float> values;
  void apply_gradients(std::size_t t, std::span<const std::uint64_t> k,
                       matrix_view<const float> g) {
    table = t;
    keys.assign(k.begin(), k.end());
    values.assign(g.data(), g.data() + g.rows() * g.cols());
  }
};
}  // namespace

TEST_CASE("servers_dense pulls and pushes the dense parameters as padded rows of one table",
          "[train][dense_path]") {
  train::servers_dense path(train::dense_rows(5, 2), 7);
  const auto pull = path.pull_request();
  REQUIRE(pull.table == 7);
  REQUIRE(std::vector<std::uint64_t>(pull.keys.begin(), pull.keys.end()) ==
          std::vector<std::uint64_t>{0, 1, 2});
  REQUIRE(pull.out.rows() == 3);
  REQUIRE(pull.out.cols() == 2);
  for (std::size_t i = 0; i < 6; ++i)
    pull.out.data()[i] = static_cast<float>(i + 1);
  std::vector<float> params(5);
  path.take(params);
  REQUIRE(params == std::vector<float>{1, 2, 3, 4, 5});
  recording_storage storage;
  const std::vector<float> grads{5, 4, 3, 2, 1};
  path.push(storage, grads);
  REQUIRE(storage.table == 7);
  REQUIRE(storage.keys == std::vector<std::uint64_t>{0, 1, 2});
  REQUIRE(storage.values == std::vector<float>{5, 4, 3, 2, 1, 0});
  std::vector<float> wrong(4);
  REQUIRE_THROWS_AS(path.take(wrong), strata::error);
  REQUIRE_THROWS_AS(path.push(storage, wrong), strata::error);
}

TEST_CASE("replicated_rows: every replica applies every worker's row gradients, bitwise equal",
          "[train][sparse_path]") {
  const std::vector<embedding::table_spec> specs{{"a", 50, 3}, {"b", 20, 1}};
  const optim::sgd opt{.lr = 0.5f};
  const embedding::uniform_init init{7, 0.1f, {}};
  const int workers = 3;
  const std::size_t batch = 40;
  const auto key_of = [](int rank, std::size_t t, std::size_t i) -> std::uint64_t {
    return (i * 7 + static_cast<std::size_t>(rank) * 3 + t) % (t == 0 ? 13 : 5);  // duplicates
  };
  const auto grad_of = [](int rank, std::size_t t, std::size_t i, std::size_t c) {
    return grad_value(rank, i * 3 + c + t * 1000);
  };
  std::vector<std::vector<float>> tables_after(workers);
  std::mutex guard;
  comm::thread_world world(workers, {.timeout_seconds = 20});
  world.run([&](comm::thread_transport& t) {
    train::replicated_rows<embedding::local<optim::sgd>> path(specs, opt, init);
    std::vector<std::vector<std::uint64_t>> keys(2);
    std::vector<matrix<float>> grads;
    std::vector<ps::table_push> pushes;
    for (std::size_t tb = 0; tb < 2; ++tb) {
      grads.emplace_back(batch, specs[tb].dim);
      for (std::size_t i = 0; i < batch; ++i) {
        keys[tb].push_back(key_of(t.rank(), tb, i));
        for (std::size_t c = 0; c < specs[tb].dim; ++c)
          grads[tb](i, c) = grad_of(t.rank(), tb, i, c);
      }
    }
    for (std::size_t tb = 0; tb < 2; ++tb)
      pushes.push_back({tb, keys[tb], grads[tb].view()});
    path.apply(t, pushes);
    std::vector<float> mine;
    for (std::size_t tb = 0; tb < 2; ++tb) {
      std::vector<std::uint64_t> all_keys(specs[tb].rows);
      for (std::uint64_t k = 0; k < all_keys.size(); ++k)
        all_keys[k] = k;
      matrix<float> rows(all_keys.size(), specs[tb].dim);
      const ps::table_pull pull{tb, all_keys, rows.view()};
      path.fetch(std::span(&pull, 1));
      mine.insert(mine.end(), rows.data(), rows.data() + rows.rows() * rows.cols());
    }
    std::lock_guard lock(guard);
    tables_after[static_cast<std::size_t>(t.rank())] = mine;
  });
  REQUIRE(tables_after[0] == tables_after[1]);
  REQUIRE(tables_after[0] == tables_after[2]);
  // Reference in float64: initial row − lr · (sum of every worker's gradients of that key).
  embedding::local<optim::sgd> fresh(specs, opt, init);
  std::size_t at = 0;
  for (std::size_t tb = 0; tb < 2; ++tb) {
    const std::size_t dim = specs[tb].dim;
    std::vector<double> sums(specs[tb].rows * dim, 0.0);
    for (int r = 0; r < workers; ++r)
      for (std::size_t i = 0; i < batch; ++i)
        for (std::size_t c = 0; c < dim; ++c)
          sums[key_of(r, tb, i) * dim + c] += grad_of(r, tb, i, c);
    for (std::uint64_t k = 0; k < specs[tb].rows; ++k) {
      const auto initial = fresh.row(tb, k);
      for (std::size_t c = 0; c < dim; ++c, ++at) {
        const double expected = initial[c] - 0.5 * sums[k * dim + c];
        REQUIRE(tables_after[0][at] == Approx(expected).margin(1e-5));
      }
    }
  }
}

TEST_CASE("replicated_rows: workers pushing different tables get an error, not a hang",
          "[train][sparse_path]") {
  const std::vector<embedding::table_spec> specs{{"a", 10, 2}, {"b", 10, 2}};
  comm::thread_world world(2, {.timeout_seconds = 10});
  REQUIRE_THROWS_WITH(world.run([&](comm::thread_transport& t) {
    train::replicated_rows<embedding::local<optim::sgd>> path(specs, optim::sgd{},
                                                              embedding::uniform_init{});
    const std::vector<std::uint64_t> keys{1, 2};
    matrix<float> g(2, 2);
    std::vector<ps::table_push> pushes{{0, keys, g.view()}};
    if (t.rank() == 1) pushes.push_back({1, keys, g.view()});
    path.apply(t, pushes);
  }),
                      Catch::Contains("do all workers push the same tables?"));
}

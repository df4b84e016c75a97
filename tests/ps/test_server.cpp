#include <catch2/catch.hpp>

#include <sys/resource.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <oneapi/tbb/global_control.h>

#include "ps/harness.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/core/memory.hpp"
#include "strata/core/timer.hpp"
#include "strata/embedding/init.hpp"
#include "strata/embedding/local.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/sgd.hpp"
#include "support/ensure.hpp"
#include "support/skip.hpp"

using namespace strata;
using ps_test::run_job;

namespace {
std::vector<std::uint64_t> iota_keys(std::size_t n, std::uint64_t first = 0) {
  std::vector<std::uint64_t> k(n);
  for (std::size_t i = 0; i < n; ++i)
    k[i] = first + i;
  return k;
}
}  // namespace

TEST_CASE("sharded storage models embedding::storage and matches local", "[ps][sharded]") {
  using storage = embedding::sharded<optim::adagrad>;
  STATIC_REQUIRE(embedding::storage<storage>);
  STATIC_REQUIRE(
      std::is_same_v<storage::rebind_consistency<ps::async>::consistency_type, ps::async>);
  const std::vector<embedding::table_spec> specs = {{"t", 30, 8}};
  const ps::shard_map map(ps::layout::dedicated(1, 2), specs);
  const optim::adagrad opt{.lr = 0.2f};
  embedding::local<optim::adagrad> ref(specs, opt);
  comm::thread_world world(3, {.timeout_seconds = 20});
  world.run([&](comm::thread_transport& t) {
    if (map.roles().is_server(t.rank())) {
      storage::server_type server(map, map.roles().server_index(t.rank()), opt);
      server.serve(t);
      return;
    }
    storage s(t, map);
    const std::vector<std::uint64_t> keys = {3, 7, 3, 29, 0, 7};
    matrix<float> got(keys.size(), 8), want(keys.size(), 8), g(keys.size(), 8);
    for (int step = 0; step < 3; ++step) {
      s.gather(0, keys, got);
      ref.gather(0, keys, want);
      strata_test::ensure(std::memcmp(got.data(), want.data(), got.size() * 4) == 0,
                          "rows differ from the local reference at step ", step);
      for (std::size_t i = 0; i < g.size(); ++i)
        g.flat()[i] = std::sin(static_cast<float>(i + step));
      s.apply_gradients(0, keys, g);
      ref.apply_gradients(0, keys, g);
    }
    s.gather(0, keys, got);
    ref.gather(0, keys, want);
    strata_test::ensure(std::memcmp(got.data(), want.data(), got.size() * 4) == 0,
                        "rows differ from the local reference at the end");
    s.shutdown();
  });
}

TEST_CASE("traffic per server grows with workers and falls with servers", "[ps][traffic]") {
  auto bytes_per_server = [](int workers, int servers) {
    const ps::shard_map map(ps::layout::dedicated(workers, servers), {{"t", 4096, 16}});
    comm::thread_world world(workers + servers, {.timeout_seconds = 20});
    run_job<ps::sync>(world, map, optim::sgd{}, [&](auto& c, int w) {
      for (int step = 0; step < 3; ++step) {
        const auto keys = iota_keys(256, static_cast<std::uint64_t>(w) * 256 + step * 1024);
        matrix<float> rows(keys.size(), 16);
        c.pull(0, keys, rows);
        c.push(0, keys, rows);
      }
    });
    double total = 0;
    for (int w = 0; w < workers; ++w)
      for (int s = 0; s < servers; ++s)
        total += static_cast<double>(world.bytes_sent(w, workers + s) +
                                     world.bytes_sent(workers + s, w));
    return total / servers;
  };
  const double w1s1 = bytes_per_server(1, 1), w3s1 = bytes_per_server(3, 1);
  const double w3s3 = bytes_per_server(3, 3);
  INFO("bytes/server: W1S1 " << w1s1 << ", W3S1 " << w3s1 << ", W3S3 " << w3s3);
  CHECK(w3s1 > 2.8 * w1s1);
  CHECK(w3s3 < 0.4 * w3s1);
}

TEST_CASE("server stats make a hot shard visible", "[ps][stats]") {
  const ps::shard_map map(ps::layout::dedicated(2, 2), {{"t", 100, 4}}, ps::partition_kind::range);
  comm::thread_world world(4, {.timeout_seconds = 20});
  auto result = run_job<ps::async>(world, map, optim::sgd{}, [&](auto& c, int) {
    const auto keys = iota_keys(10);  // all in server 0's range [0, 50)
    matrix<float> rows(10, 4);
    c.pull(0, keys, rows);
    c.push(0, keys, rows);
  });
  CHECK(result.stats[0].keys_pulled == 20);
  CHECK(result.stats[0].keys_pushed == 20);
  CHECK(result.stats[0].rows == 10);
  CHECK(result.stats[0].bytes_sent > 0);
  CHECK(result.stats[1].keys_pulled == 0);
  CHECK(result.stats[1].push_requests == 2);  // empty pushes still count the step
  CHECK(result.stats[1].rows == 0);
}

TEST_CASE("fp16 pulls halve reply bytes and round each value", "[ps][fp16]") {
  const ps::shard_map map(ps::layout::dedicated(1, 1), {{"t", 64, 32}});
  const embedding::uniform_init init{};
  for (bool half : {false, true}) {
    comm::thread_world world(2, {.timeout_seconds = 20});
    run_job<ps::sync>(world, map, optim::sgd{},
                      [&](auto& c, int) {
                        const auto keys = iota_keys(64);
                        matrix<float> rows(64, 32);
                        c.pull(0, keys, rows);
                        for (std::size_t k = 0; k < 64; ++k)
                          for (std::size_t j = 0; j < 32; ++j) {
                            const float exact = init.value(0, k, j, 32);
                            const float want =
                                half ? compress::half_to_float(compress::float_to_half(exact))
                                     : exact;
                            REQUIRE(rows(k, j) == want);
                          }
                      },
                      {}, {.fp16_pulls = half});
    const auto reply = world.bytes_sent(1, 0);
    CHECK(reply == ps::header_bytes * 2 + 64 * 32 * (half ? 2 : 4));  // pull reply + shutdown ack
  }
}

TEST_CASE("int8 pushes send ~4x fewer gradient bytes and still converge", "[ps][compress]") {
  using int8 = compress::int8_block<256>;
  const std::size_t dim = 256, keys_per_push = 40, steps = 4;
  auto push_bytes = [&]<class Codec>(Codec) {
    const ps::shard_map map(ps::layout::dedicated(1, 1), {{"t", 1000, dim}});
    comm::thread_world world(2, {.timeout_seconds = 20});
    auto result =
        run_job<ps::async, optim::sgd, Codec>(world, map, optim::sgd{}, [&](auto& c, int) {
          for (std::size_t step = 0; step < steps; ++step) {
            const auto keys = iota_keys(keys_per_push, step * 100);
            matrix<float> g(keys_per_push, dim);
            for (std::size_t i = 0; i < g.size(); ++i)
              g.flat()[i] = std::cos(static_cast<float>(i));
            c.push(0, keys, g);
          }
        });
    const auto& s = result.stats[0];
    REQUIRE(s.keys_pushed == keys_per_push * steps);
    // Gradient bytes = everything the worker sent minus headers (pushes + shutdown) and keys.
    const double total = static_cast<double>(world.bytes_sent(0, 1));
    return std::pair(total, total - (steps + 1) * ps::header_bytes - s.keys_pushed * 8.0);
  };
  const auto [fp32_total, fp32_grads] = push_bytes(compress::identity{});
  const auto [int8_total, int8_grads] = push_bytes(int8{});
  INFO("fp32 " << fp32_total << " B (" << fp32_grads << " gradient), int8 " << int8_total << " B ("
               << int8_grads << " gradient)");
  CHECK(fp32_grads / int8_grads >= 3.9);
  CHECK(fp32_total / int8_total >= 3.7);

  // Convergence: 0.5 ||row - target||^2 with int8 pushes and per-key error feedback.
  const ps::shard_map map(ps::layout::dedicated(2, 1), {{"t", 8, 16}});
  comm::thread_world world(3, {.timeout_seconds = 20});
  double err = 0;
  bool residual_kept = false;
  run_job<ps::sync, optim::sgd, compress::int8_block<16>>(
      world, map, optim::sgd{.lr = 0.2f}, [&](auto& c, int w) {
        const auto keys = iota_keys(8);
        matrix<float> rows(8, 16), g(8, 16);
        for (int step = 0; step < 60; ++step) {
          c.pull(0, keys, rows);
          for (std::size_t k = 0; k < 8; ++k)
            for (std::size_t j = 0; j < 16; ++j)
              g(k, j) = 0.5f * (rows(k, j) - static_cast<float>(k) * 0.1f);
          c.push(0, keys, g);
        }
        if (w != 0) return;
        c.pull(0, keys, rows);
        for (std::size_t k = 0; k < 8; ++k)
          for (std::size_t j = 0; j < 16; ++j)
            err = std::max(err, std::abs(rows(k, j) - static_cast<double>(k) * 0.1));
        for (std::size_t k = 0; k < 8; ++k)
          for (float r : c.residual(0, k))
            residual_kept = residual_kept || r != 0.0f;
      });
  CHECK(err < 1e-3);
  CHECK(residual_kept);
}

TEST_CASE("bad keys and bad requests raise clear errors", "[ps][errors]") {
  const ps::shard_map map(ps::layout::dedicated(2, 1), {{"user", 50, 4}, {"any", 0, 4}});
  comm::thread_world world(3, {.timeout_seconds = 20});
  run_job<ps::async>(world, map, optim::sgd{}, [&](auto& c, int w) {
    matrix<float> rows(2, 4);
    const std::vector<std::uint64_t> big = {~0ull, 1ull << 50};
    c.pull(1, big, rows);  // unbounded table: any 64-bit key
    if (w != 0) return;    // Catch2 assertions from one thread only
    const std::vector<std::uint64_t> bad = {3, 50};
    REQUIRE_THROWS_WITH(c.pull(0, bad, rows), Catch::Contains("key 50") &&
                                                  Catch::Contains("table 0 'user'") &&
                                                  Catch::Contains("[0, 50)"));
    REQUIRE_THROWS_AS(c.push(0, bad, rows), error);
    matrix<float> wrong(2, 3);
    REQUIRE_THROWS_WITH(c.pull(0, std::vector<std::uint64_t>{1, 2}, wrong),
                        Catch::Contains("needs 2 × 4"));
    REQUIRE_THROWS_WITH(c.pull(2, std::vector<std::uint64_t>{1, 2}, rows),
                        Catch::Contains("table 2 outside"));
  });

  // Garbage from a worker gets an error reply; the server keeps serving.
  comm::thread_world world2(2, {.timeout_seconds = 20});
  const ps::shard_map one(ps::layout::dedicated(1, 1), {{"user", 50, 4}});
  world2.run([&](comm::thread_transport& t) {
    if (t.rank() == 1) {
      ps::server<optim::sgd, ps::sync> server(one, 0);
      server.serve(t);
      return;
    }
    const std::vector<std::byte> junk(20, std::byte{0x42});
    t.send(1, comm::tags::ps_request, junk);
    const auto reply = t.recv_message(1, comm::tags::ps_reply);
    const auto h = ps::decode_header(reply);
    REQUIRE(h.type == ps::msg_type::error_reply);
    const auto info = ps::decode_error(h, reply);
    CHECK(info.code == errc::bad_message);
    CHECK_THAT(info.text, Catch::Contains("shorter than the 48-byte header"));
    ps::client<ps::sync> c(t, one);
    matrix<float> rows(1, 4);
    c.pull(0, std::vector<std::uint64_t>{7}, rows);
    CHECK(rows(0, 0) == embedding::uniform_init{}.value(0, 7, 0, 4));
    c.shutdown();
  });

  // A worker with another consistency policy is refused by name.
  comm::thread_world world3(2, {.timeout_seconds = 20});
  REQUIRE_THROWS_WITH(world3.run([&](comm::thread_transport& t) {
    if (t.rank() == 1) {
      ps::server<optim::sgd, ps::sync> server(one, 0);
      server.serve(t);
      return;
    }
    ps::client<ps::async> c(t, one);
    matrix<float> rows(1, 4);
    c.pull(0, std::vector<std::uint64_t>{7}, rows);
  }),
                      Catch::Contains("consistency code 2"));
}

TEST_CASE("hot keys from many workers with 2 server threads", "[ps][concurrency]") {
  const int workers = 4, steps = 20;
  const std::size_t dim = 64, wide = 400;
  const embedding::uniform_init init{};
  for (auto kind : {ps::placement::dedicated, ps::placement::colocated}) {
    const auto roles = kind == ps::placement::dedicated ? ps::layout::dedicated(workers, 1)
                                                        : ps::layout::colocated(workers);
    const ps::shard_map map(roles, {{"hot", 0, dim}});
    comm::thread_world world(roles.ranks(), {.timeout_seconds = 30});
    std::mutex mutex;
    std::atomic<int> mismatches{0};
    std::map<std::uint64_t, std::vector<float>> rows_after;
    run_job<ps::async>(
        world, map, optim::sgd{.lr = 0.5f},
        [&](auto& c, int) {
          const std::vector<std::uint64_t> hot = {0, 1, 2, 0};  // key 0 twice per push
          matrix<float> rows(hot.size(), dim), ones(hot.size(), dim);
          std::fill(ones.flat().begin(), ones.flat().end(), 1.0f);
          const auto many = iota_keys(wide, 100);
          matrix<float> many_ones(wide, dim), many_rows(wide, dim);
          std::fill(many_ones.flat().begin(), many_ones.flat().end(), 1.0f);
          for (int step = 0; step < steps; ++step) {
            c.pull(0, hot, rows);
            if (rows(0, 0) != rows(3, 0)) mismatches.fetch_add(1);
            c.push(0, hot, ones);
            if (step % 5 == 0) {
              c.pull(0, many, many_rows);
              c.push(0, many, many_ones);
            }
          }
        },
        {.threads = 2}, {},
        [&](const auto& server) {
          std::lock_guard lock(mutex);
          server.for_each_row(
              [&](std::size_t, std::uint64_t key, std::span<const float> row,
                  std::span<const float>) { rows_after[key].assign(row.begin(), row.end()); });
        });
    // Every push applied exactly once, whatever the interleaving: each update is the same
    // `x -= 0.5 · g`, so the sequence of values is fixed.
    auto expect = [&](std::uint64_t key, std::size_t col, float grad, int times) {
      float x = init.value(0, key, col, dim);
      for (int i = 0; i < times; ++i)
        x -= 0.5f * grad;
      return x;
    };
    CHECK(mismatches.load() == 0);  // duplicate keys of one pull get the same row
    REQUIRE(rows_after.size() == 3 + wide);
    for (std::size_t col : {std::size_t{0}, dim - 1}) {
      CHECK(rows_after[0][col] == expect(0, col, 2.0f, workers * steps));
      CHECK(rows_after[2][col] == expect(2, col, 1.0f, workers * steps));
      CHECK(rows_after[100 + wide - 1][col] == expect(100 + wide - 1, col, 1.0f, workers * 4));
    }
  }
}

TEST_CASE("a shard exports and imports its rows (checkpoints)", "[ps][checkpoint]") {
  const ps::shard_map map(ps::layout::dedicated(1, 2), {{"a", 100, 4}, {"b", 0, 2}});
  ps::server<optim::adagrad, ps::sync> s0(map, 0), s1(map, 1);
  std::size_t imported = 0;
  for (std::uint64_t key = 0; key < 100; ++key) {
    auto& target = map.server_of(0, key) == 0 ? s0 : s1;
    const float v = static_cast<float>(key);
    target.import_row(0, key, std::vector<float>{v, v, v, v}, std::vector<float>{1, 2, 3, 4});
    ++imported;
  }
  std::map<std::uint64_t, float> seen;
  for (auto* s : {&s0, &s1})
    s->for_each_row([&](std::size_t t, std::uint64_t key, std::span<const float> w,
                        std::span<const float> state) {
      REQUIRE(t == 0);
      REQUIRE(state.size() == 4);
      CHECK(state[3] == 4.0f);
      seen[key] = w[0];
    });
  REQUIRE(seen.size() == imported);
  CHECK(seen[42] == 42.0f);
  CHECK(s0.rows(0) + s1.rows(0) == 100);
  const std::uint64_t foreign = map.server_of(0, 5) == 0 ? 5 : 6;
  auto& wrong = map.server_of(0, foreign) == 0 ? s1 : s0;
  CHECK_THROWS_WITH(wrong.import_row(0, foreign, std::vector<float>(4), std::vector<float>(4)),
                    Catch::Contains("belongs to server"));
  CHECK_THROWS_AS(s0.import_row(0, 5, std::vector<float>(3), std::vector<float>(4)), error);
  CHECK_THROWS_WITH(s0.import_row(0, 100, std::vector<float>(4), std::vector<float>(4)),
                    Catch::Contains("outside its rows [0, 100)"));
}

TEST_CASE("read_rows serves in-process pulls once the step is servable, else times out",
          "[ps][in_process]") {
  const ps::shard_map map(ps::layout::dedicated(2, 1), {{"t", 30, 4}});
  ps::server<optim::sgd, ps::sync> server(map, 0, optim::sgd{});
  const std::vector<std::uint64_t> keys{3, 7, 3};
  std::vector<float> got(keys.size() * 4, -1.0f);
  const auto sink = [&](std::size_t i, const float* row) {
    std::copy_n(row, 4, got.begin() + static_cast<std::ptrdiff_t>(i * 4));
  };
  // Step 0 needs no pushes: the initial rows.
  server.read_rows(0, 0, 0, keys, 1.0, sink);
  const embedding::uniform_init init{};
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (std::size_t c = 0; c < 4; ++c)
      CHECK(got[i * 4 + c] == init.value(0, keys[i], c, 4));
  CHECK(server.stats().pull_requests == 1);
  // Step 1 under sync needs both workers' first pushes: nobody pushed, so it times out.
  stopwatch watch;
  CHECK_THROWS_WITH(server.read_rows(1, 0, 1, keys, 0.05, sink),
                    Catch::Contains("not servable within 0.05 s under sync"));
  CHECK(watch.seconds() >= 0.04);
  CHECK_THROWS_WITH(server.read_rows(2, 0, 0, keys, 0.05, sink),
                    Catch::Contains("worker 2 outside the 2 workers"));
  CHECK_THROWS_AS(server.read_rows(0, 1, 0, keys, 0.05, sink), strata::error);
}

TEST_CASE("an in-process reader waiting for a step stops when its server stops serving",
          "[ps][in_process]") {
  // Worker 0 fails before pushing (as a diverged worker stops); the world stops, the server's
  // serve() ends aborted, and worker 1's in-process pull of step 1 — which can never be served
  // — ends at once with errc::aborted instead of waiting out its 20 s timeout.
  const ps::shard_map map(ps::layout::dedicated(2, 1), {{"t", 30, 4}});
  ps::server<optim::sgd, ps::sync> server(map, 0, optim::sgd{});
  const std::vector<std::uint64_t> keys{3, 7};
  std::atomic<int> reader_code{-1};
  comm::thread_world world(3, {.timeout_seconds = 20});
  stopwatch watch;
  REQUIRE_THROWS_WITH(world.run([&](comm::thread_transport& t) {
    if (t.rank() == 2) {
      server.serve(t);
    } else if (t.rank() == 0) {
      fail(errc::diverged, "worker 0 stops");
    } else {
      try {
        server.read_rows(1, 0, 1, keys, 20.0, [](std::size_t, const float*) {});
      } catch (const strata::error& e) {
        reader_code = static_cast<int>(e.code());
        throw;
      }
    }
  }),
                      Catch::Contains("worker 0 stops"));
  CHECK(watch.seconds() < 10.0);
  CHECK(reader_code.load() == static_cast<int>(errc::aborted));
}

TEST_CASE("a client refuses in-process readers that do not match the servers", "[ps][in_process]") {
  const ps::shard_map map(ps::layout::dedicated(1, 2), {{"t", 30, 4}});
  comm::thread_world world(3, {.timeout_seconds = 20});
  bool refused = false;
  world.run([&](comm::thread_transport& t) {
    if (t.rank() != map.roles().worker_rank(0)) return;
    ps::client_options copts;
    copts.in_process_servers.resize(1);  // one reader for two servers
    try {
      ps::client<ps::sync> c(t, map, copts);
    } catch (const error& e) {
      refused = std::string(e.what()).find("1 in-process server readers for 2 servers") !=
                std::string::npos;
    }
  });
  CHECK(refused);
}

TEST_CASE("the dense table's key plan: changing key lists equal a plain table, every path",
          "[ps][dense_table]") {
  // Table 0 is the servers' dense table (its rows resolved once per key list, its update
  // parallel over stripes above 2^16 floats); every push and pull must still equal a local
  // table bitwise, whether the keys repeat, shrink, come unsorted with duplicates or return.
  const std::vector<embedding::table_spec> specs = {{"dense", 5000, 16}, {"t", 50, 16}};
  const ps::shard_map map(ps::layout::dedicated(1, 2), specs);
  const optim::adagrad opt{.lr = 0.1f};
  using server_type = ps::server<optim::adagrad, ps::sync, compress::identity, optim::adagrad>;
  const std::vector<std::uint64_t> all = iota_keys(5000);
  std::vector<std::uint64_t> every_third, shuffled;
  for (std::uint64_t k = 0; k < 5000; k += 3)
    every_third.push_back(k);
  for (std::uint64_t k = 0; k < 900; ++k)
    shuffled.push_back((k * 7919) % 1200);  // unsorted, with duplicates
  const std::vector<const std::vector<std::uint64_t>*> steps = {&all,      &all, &every_third,
                                                                &shuffled, &all, &every_third};
#if defined(__SANITIZE_THREAD__)
  // libtbb is not TSan-instrumented: a parallel_for hands its body's captures to a stealing
  // thread through atomics TSan cannot see (.ci/tsan.supp). One TBB thread keeps the split
  // code paths (the server's stripe-parallel update included) on the calling thread.
  const tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
#endif
  // One server thread updates the dense table serially (it borrows no oneTBB pool); two run
  // its stripes in parallel on the server's own arena.
  for (const auto& [in_process, threads] :
       {std::pair{false, 1}, std::pair{true, 1}, std::pair{false, 2}, std::pair{true, 2}}) {
    CAPTURE(in_process, threads);
    embedding::local<optim::adagrad> ref(specs, opt);
    std::vector<std::unique_ptr<server_type>> servers;
    for (int s = 0; s < 2; ++s)
      servers.push_back(std::make_unique<server_type>(map, s, opt, opt, 0,
                                                      ps::server_options{.threads = threads}));
    ps::client_options copts;
    if (in_process)
      for (auto& server : servers)
        copts.in_process_servers.emplace_back(
            [at = server.get()](int worker, std::size_t table, std::uint64_t step,
                                std::span<const std::uint64_t> keys,
                                const std::function<void(std::size_t, const float*)>& sink) {
              at->read_rows(worker, table, step, keys, 30.0, sink);
            });
    comm::thread_world world(3, {.timeout_seconds = 30});
    world.run([&](comm::thread_transport& t) {
      if (map.roles().is_server(t.rank())) {
        servers[static_cast<std::size_t>(map.roles().server_index(t.rank()))]->serve(t);
        return;
      }
      ps::client<ps::sync, comm::thread_transport> c(t, map, copts);
      for (std::size_t step = 0; step < steps.size(); ++step) {
        const auto& keys = *steps[step];
        matrix<float> got(keys.size(), 16), want(keys.size(), 16), g(keys.size(), 16);
        c.pull(0, keys, got);
        ref.gather(0, keys, want);
        strata_test::ensure(std::memcmp(got.data(), want.data(), got.size() * 4) == 0,
                            "dense-table rows differ from the local table at step ", step);
        for (std::size_t i = 0; i < g.size(); ++i)
          g.flat()[i] = std::sin(static_cast<float>(i % 977 + step));
        c.push(0, keys, g);
        ref.apply_gradients(0, keys, g);
      }
      matrix<float> got(all.size(), 16), want(all.size(), 16);
      c.pull(0, all, got);
      ref.gather(0, all, want);
      strata_test::ensure(std::memcmp(got.data(), want.data(), got.size() * 4) == 0,
                          "dense-table rows differ from the local table at the end");
      c.shutdown();
      // The pushes of the whole table (~190 KB per server) moved to the servers, which handed
      // their buffers back once applied: the next large message is built in one of them.
      strata_test::ensure(!t.take_buffer(std::size_t{100} << 10).empty(),
                          "no push buffer came back to the world's pool");
    });
    CHECK(servers[0]->rows(0) + servers[1]->rows(0) == all.size());
    CHECK(servers[0]->rows(0) > 0);
    CHECK(servers[1]->rows(0) > 0);
  }
}

TEST_CASE("a server's rows take at most shard_table_bytes", "[ps][memory]") {
  // The start-up check's estimate of a server's table (ctr_train) against the stripes' real
  // row stores: every row imported, so the stripes hold rows / 64 each, give or take the hash.
  const std::size_t dim = 16, state = optim::adagrad::state_floats(dim);
  for (const std::uint64_t rows : {std::uint64_t{3'000}, std::uint64_t{100'000}}) {
    const ps::shard_map map(ps::layout::dedicated(1, 1), {{"C1", rows, dim}});
    ps::server<optim::adagrad, ps::sync> server(map, 0);
    const std::vector<float> w(dim, 0.5f), s(state, 0.0f);
    for (std::uint64_t key = 0; key < rows; ++key)
      server.import_row(0, key, w, s);
    const auto bound = ps::shard_table_bytes(rows, dim, state);
    INFO("rows " << rows << ": bytes " << server.bytes(0) << ", shard_table_bytes " << bound);
    CHECK(server.rows(0) == rows);
    CHECK(server.bytes(0) <= bound);
    CHECK(static_cast<double>(server.bytes(0)) >= 0.85 * static_cast<double>(bound));
  }
  // Large tables: about bytes_per_row a row.
  const double big = static_cast<double>(ps::shard_table_bytes(100'000'000, dim, state));
  CHECK(big / 1e8 <= row_store::bytes_per_row(dim, state) * 1.001);
  CHECK(big / 1e8 >= 4.0 * (dim + state) + 8);
}

TEST_CASE("a server that runs out of memory answers errc::out_of_memory naming the table",
          "[ps][memory]") {
  // The real failure, not a simulated one: the worker lowers the process's address-space
  // limit to 96 MiB above what it maps, then pulls 800k new rows of dim 64 (~205 MiB), 8000 a
  // pull, from a server thread of the same process. The server's row store fails to allocate
  // (std::bad_alloc), the server answers with an error reply and keeps serving.
  if (strata_test::sanitized()) {
    strata_test::skip("sanitizer build: its shadow memory and allocator defeat address limits");
    return;
  }
  const std::size_t dim = 64, keys = 800'000;
  const ps::shard_map map(ps::layout::dedicated(1, 1), {{"C1", 0, dim}});
  comm::thread_world world(2, {.timeout_seconds = 60});
  std::string text;
  errc code = errc::internal;
  std::size_t rows_after = 0;
  world.run([&](comm::thread_transport& t) {
    if (t.rank() == 1) {
      ps::server<optim::sgd, ps::async> server(map, 0);
      server.serve(t);
      rows_after = server.rows(0);
      return;
    }
    ps::client<ps::async> c(t, map);
    constexpr std::size_t batch = 8000;  // keys a pull: small replies, the rows pile up
    matrix<float> rows(batch, dim);
    {
      rlimit old{};
      REQUIRE(::getrlimit(RLIMIT_AS, &old) == 0);
      rlimit low = old;
      low.rlim_cur = current_process_memory().address_space + (96u << 20);
      REQUIRE(::setrlimit(RLIMIT_AS, &low) == 0);
      try {
        for (std::uint64_t first = 0; first < keys; first += batch)
          c.pull(0, iota_keys(batch, first), rows);
      } catch (const error& e) {
        code = e.code();
        text = e.what();
      }
      ::setrlimit(RLIMIT_AS, &old);
    }
    // Still serving: a small pull works.
    matrix<float> one(1, dim);
    c.pull(0, std::vector<std::uint64_t>{7}, one);
    c.shutdown();
  });
  CHECK(code == errc::out_of_memory);
  CHECK_THAT(text, Catch::Contains("out of memory serving table C1 (0), of which it holds") &&
                       Catch::Contains("this server holds") &&
                       Catch::Contains("run more server processes (--servers)"));
  INFO(text);
  CHECK(rows_after > 1000);  // rows made before the allocation failed stay usable
  CHECK(rows_after < keys);
}

TEST_CASE("server_core and client_core take the policy and the push codec at run time",
          "[ps][consistency]") {
  using int8 = compress::int8_block<16>;
  STATIC_REQUIRE(ps::rule_of<ps::bounded<5>>.code == (3u | (5u << 8)));
  STATIC_REQUIRE(ps::rule_of<ps::async>.max_staleness == ps::no_bound);
  // bounded<5> as a run-time value (what a bound chosen at run time is).
  const ps::consistency_rule bounded5{"bounded", 3u | (5u << 8), false, true, 5};
  const ps::consistency_rule chosen = ps::bounded_rule(5);
  CHECK(std::string(chosen.name) == "bounded");
  CHECK(chosen.code == bounded5.code);
  CHECK(chosen.aggregates_step == bounded5.aggregates_step);
  CHECK(chosen.blocks_on_step == bounded5.blocks_on_step);
  CHECK(chosen.max_staleness == bounded5.max_staleness);
  const ps::shard_map map(ps::layout::dedicated(1, 1), {{"user", 64, 4}});
  const optim::sgd sgd{.lr = 0.5f};
  const auto keys = iota_keys(24, 7);
  // One worker pulls then pushes 6 steps of int8-compressed gradients; the rows it pulls last.
  const auto train = [&](auto make_server, auto make_client) {
    std::vector<float> last(keys.size() * 4);
    comm::thread_world world(2, {.timeout_seconds = 20});
    world.run([&](comm::thread_transport& t) {
      if (t.rank() == 1) {
        auto server = make_server();
        server.serve(t);
        return;
      }
      auto c = make_client(t);
      matrix<float> rows(keys.size(), 4), grads(keys.size(), 4);
      for (int step = 0; step < 6; ++step) {
        c.pull(0, keys, rows);
        for (std::size_t i = 0; i < keys.size(); ++i)
          for (std::size_t j = 0; j < 4; ++j)
            grads(i, j) = rows(i, j) - 0.01f * static_cast<float>(i + j + step);
        c.push(0, keys, grads);
      }
      c.pull(0, keys, rows);
      std::copy_n(rows.data(), last.size(), last.begin());
      c.shutdown();
    });
    return last;
  };
  const auto typed =
      train([&] { return ps::server<optim::sgd, ps::bounded<5>, int8>(map, 0, sgd); },
            [&](comm::thread_transport& t) {
              return ps::client<ps::bounded<5>, comm::thread_transport, int8>(t, map);
            });
  const auto at_run_time = train(
      [&] {
        return ps::server_core<optim::sgd>(map, 0, bounded5, sgd, {},
                                           ps::push_decoding::of(int8{}));
      },
      [&](comm::thread_transport& t) {
        return ps::client_core<comm::thread_transport, int8>(t, map, bounded5);
      });
  // The typed wrappers with ps::run_time_rule as the type (what trainers name).
  const auto chosen_at_run_time =
      train([&] { return ps::server<optim::sgd, ps::run_time_rule, int8>(map, 0, chosen, sgd); },
            [&](comm::thread_transport& t) {
              return ps::client<ps::run_time_rule, comm::thread_transport, int8>(t, map, chosen);
            });
  REQUIRE(typed.size() == at_run_time.size());
  CHECK(std::memcmp(typed.data(), at_run_time.data(), typed.size() * sizeof(float)) == 0);
  REQUIRE(typed.size() == chosen_at_run_time.size());
  CHECK(std::memcmp(typed.data(), chosen_at_run_time.data(), typed.size() * sizeof(float)) == 0);
  // The rows moved (the pushes were decoded and applied).
  CHECK(typed[0] != embedding::uniform_init{}.value(0, keys[0], 0, 4));

  // A run-time policy is refused by a server of another, by its code; so is an fp32 push to a
  // server that expects compressed gradients.
  comm::thread_world world(2, {.timeout_seconds = 20});
  REQUIRE_THROWS_WITH(world.run([&](comm::thread_transport& t) {
    if (t.rank() == 1) {
      ps::server_core<optim::sgd> server(map, 0, bounded5, sgd);
      server.serve(t);
      return;
    }
    ps::client<ps::bounded<4>> c(t, map);
    matrix<float> rows(1, 4);
    c.pull(0, std::vector<std::uint64_t>{7}, rows);
  }),
                      Catch::Contains("consistency code"));
  comm::thread_world world2(2, {.timeout_seconds = 20});
  REQUIRE_THROWS_WITH(world2.run([&](comm::thread_transport& t) {
    if (t.rank() == 1) {
      ps::server_core<optim::sgd> server(map, 0, bounded5, sgd, {}, ps::push_decoding::of(int8{}));
      server.serve(t);
      return;
    }
    ps::client_core<comm::thread_transport> c(t, map, bounded5);
    matrix<float> rows(1, 4);
    c.push(0, std::vector<std::uint64_t>{7}, rows);
    c.shutdown();
  }),
                      Catch::Contains("int8_block-compressed gradients"));
}

TEST_CASE("a run-time consistency rule that no policy has, or not the type's, is refused",
          "[ps][consistency][errors]") {
  const ps::shard_map map(ps::layout::dedicated(1, 1), {{"user", 64, 4}});
  const auto refused = [&](ps::consistency_rule rule, const char* why) {
    REQUIRE_THROWS_WITH(ps::server_core<optim::sgd>(map, 0, rule),
                        Catch::Contains("ps::server: consistency rule") && Catch::Contains(why) &&
                            Catch::Contains("ps::rule_of"));
  };
  refused({"odd", 1, true, false, 0}, "does not block");
  refused({"bounded", 3, false, true, std::uint64_t{1} << 24}, "2^24 steps or more");
  refused({nullptr, 1, true, true, 0}, "has no name");
  REQUIRE_THROWS_WITH(ps::check_rule({"wide", 3, false, true, ps::no_bound}, "ps::client"),
                      Catch::Contains("ps::client: consistency rule 'wide'"));
  // Every policy's own rule passes.
  ps::check_rule(ps::rule_of<ps::sync>, "test");
  ps::check_rule(ps::rule_of<ps::async>, "test");
  ps::check_rule(ps::rule_of<ps::bounded<(std::uint64_t{1} << 24) - 1>>, "test");
  // A bound chosen at run time: 2^24 steps or more is refused with the limit.
  REQUIRE_THROWS_WITH(ps::bounded_rule(std::uint64_t{1} << 24),
                      Catch::Contains("ps::bounded_rule") && Catch::Contains("below 2^24"));
  CHECK(ps::bounded_rule((std::uint64_t{1} << 24) - 1).code ==
        ps::rule_of<ps::bounded<(std::uint64_t{1} << 24) - 1>>.code);
  // A policy type takes only its own rule (run_time_rule takes any valid one).
  using sync_server = ps::server<optim::sgd, ps::sync>;
  using bounded2_server = ps::server<optim::sgd, ps::bounded<2>>;
  using bounded3_server = ps::server<optim::sgd, ps::bounded<3>>;
  using chosen_server = ps::server<optim::sgd, ps::run_time_rule>;
  REQUIRE_THROWS_WITH(sync_server(map, 0, ps::rule_of<ps::async>),
                      Catch::Contains("ps::server: consistency rule 'async'") &&
                          Catch::Contains("given to a sync") &&
                          Catch::Contains("ps::run_time_rule"));
  REQUIRE_THROWS_WITH(bounded2_server(map, 0, ps::bounded_rule(3)),
                      Catch::Contains("given to a bounded"));
  REQUIRE_THROWS_WITH(chosen_server(map, 0, ps::consistency_rule{"odd", 1, true, false, 0}),
                      Catch::Contains("does not block"));
  CHECK_NOTHROW(bounded3_server(map, 0, ps::bounded_rule(3)));
  CHECK_NOTHROW(chosen_server(map, 0, ps::bounded_rule(3)));
}

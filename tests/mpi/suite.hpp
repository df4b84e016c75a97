/// @file suite.hpp
/// Test bodies written once over any `comm::transport`: each runs on every rank and checks
/// with `ensure` (throws `strata::error`). The MPI tests run them on `mpi::transport` under
/// mpiexec and, in the same binary, on `thread_world` — one suite, two transports.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/compress/compressed_allreduce.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/core/matrix.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/timer.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/mpi/roles.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/sparse_gradient.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/server.hpp"

namespace mpi_suite {

using namespace strata;

/// Throws `errc::internal` with the message unless `ok` (Catch2 assertions are not
/// thread-safe, and a throwing rank stops a thread_world cleanly).
template <class... Parts>
void ensure(bool ok, const Parts&... parts) {
  if (!ok) fail(errc::internal, cat("check failed: ", parts...));
}

/// Runs `fn` and checks that it raises `strata::error` with `code` and every one of `words`.
template <class Fn>
void ensure_error(Fn&& fn, errc code, std::initializer_list<std::string> words) {
  try {
    fn();
  } catch (const error& e) {
    const std::string what = e.what();
    ensure(e.code() == code, "expected ", to_string(code), ", got: ", what);
    for (const auto& w : words)
      ensure(what.find(w) != std::string::npos, "'", w, "' missing from: ", what);
    return;
  }
  ensure(false, "expected an error ", to_string(code));
}

template <class V>
V value_for(int rank, std::size_t i) {
  if constexpr (std::is_floating_point_v<V>)
    return static_cast<V>(counter_rng{17, static_cast<std::uint64_t>(rank)}.normal(i));
  else
    return static_cast<V>((rank + 1) * 3 + static_cast<int>(i % 17));
}

/// Ring allreduce of every value type, sum and mean, several lengths, against a float64 sum.
template <class V, comm::transport T>
void ring_allreduce_matches_reference(T& t) {
  const int n = t.size();
  for (std::size_t count : {0u, 1u, 5u, 1000u, 4099u})
    for (auto op : {comm::reduce_op::sum, comm::reduce_op::mean})
      for (std::size_t chunk : {std::size_t{64}, std::size_t{1} << 20}) {
        std::vector<V> data(count);
        for (std::size_t i = 0; i < count; ++i)
          data[i] = value_for<V>(t.rank(), i);
        comm::allreduce(t, std::span(data), op, comm::ring_allreduce{chunk});
        for (std::size_t i = 0; i < count; ++i) {
          double exact = 0;
          for (int r = 0; r < n; ++r)
            exact += static_cast<double>(value_for<V>(r, i));
          if constexpr (std::is_floating_point_v<V>) {
            if (op == comm::reduce_op::mean) exact /= n;
            ensure(std::abs(static_cast<double>(data[i]) - exact) <= 1e-5 * (1 + std::abs(exact)),
                   "n=", n, " count=", count, " i=", i, ": ", data[i], " != ", exact);
          } else {
            auto expected = static_cast<V>(exact);
            if (op == comm::reduce_op::mean) expected /= static_cast<V>(n);
            ensure(data[i] == expected, "n=", n, " count=", count, " i=", i, ": ", data[i],
                   " != ", expected);
          }
        }
      }
}

/// allgather, broadcast from every root, barrier.
template <comm::transport T>
void gather_broadcast_barrier(T& t) {
  const int n = t.size();
  std::vector<int> mine{t.rank(), t.rank() * 10};
  std::vector<int> all(2 * static_cast<std::size_t>(n));
  comm::allgather(t, std::span<const int>(mine), std::span(all));
  for (int r = 0; r < n; ++r)
    ensure(all[2 * static_cast<std::size_t>(r)] == r &&
               all[2 * static_cast<std::size_t>(r) + 1] == r * 10,
           "allgather block ", r);
  for (int root = 0; root < n; ++root) {
    std::vector<double> data(3, t.rank() == root ? 1.5 * root : -1.0);
    comm::broadcast(t, std::span(data), root);
    ensure(data == std::vector<double>(3, 1.5 * root), "broadcast from ", root);
  }
  comm::barrier(t);
}

/// compressed_allreduce with int8_block<256> against the float64 sum, within the codec's
/// bound (N encodes of at most absmax/254 each, plus float summation); ranks end identical
/// (checked through an allgather of a checksum).
template <comm::transport T>
void compressed_allreduce_within_bound(T& t) {
  const int n = t.size();
  const std::size_t count = 3000;
  std::vector<float> data(count);
  for (std::size_t i = 0; i < count; ++i)
    data[i] = value_for<float>(t.rank(), i);
  compress::int8_block<256> codec;
  compress::compressed_allreduce(t, std::span(data), codec, comm::reduce_op::sum, 512);
  double global = 0;
  std::vector<double> exact(count), abs_sum(count);
  for (std::size_t i = 0; i < count; ++i) {
    for (int r = 0; r < n; ++r) {
      exact[i] += value_for<float>(r, i);
      abs_sum[i] += std::abs(value_for<float>(r, i));
    }
    global = std::max(global, abs_sum[i]);
  }
  for (std::size_t i = 0; i < count; ++i) {
    const double bound = n * global / 254.0 * 1.01 + (n + 1) * 0x1p-23 * abs_sum[i];
    ensure(std::abs(data[i] - exact[i]) <= bound, "int8 allreduce i=", i, ": ", data[i], " vs ",
           exact[i], " bound ", bound);
  }
  std::uint64_t mine = 0;
  for (float v : data) {
    std::uint32_t bits;
    std::memcpy(&bits, &v, 4);
    mine = mix_ids(mine, bits);
  }
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(n));
  comm::allgather(t, std::span<const std::uint64_t>(&mine, 1), std::span(sums));
  for (int r = 1; r < n; ++r)
    ensure(sums[static_cast<std::size_t>(r)] == sums[0], "rank ", r, " ended with other values");
}

/// Ring allreduce of P bytes: each rank sends 2(N−1)/N·P (+ 8 bytes of length check).
template <comm::transport T>
void ring_sends_two_n_minus_one_over_n(T& t) {
  const int n = t.size();
  const std::size_t count = 12 * 1024;  // divisible by 2, 3 and 4
  std::vector<float> data(count, 1.0f);
  const auto before = comm::total_bytes_sent(t);
  const auto before_in = comm::total_bytes_received(t);
  comm::allreduce(t, std::span(data));
  const auto sent = comm::total_bytes_sent(t) - before;
  const auto received = comm::total_bytes_received(t) - before_in;
  const double expected =
      2.0 * (n - 1) / n * static_cast<double>(count * sizeof(float)) + (n > 1 ? 8.0 : 0.0);
  ensure(static_cast<double>(sent) == expected, "sent ", sent, " bytes, expected ", expected);
  ensure(static_cast<double>(received) == expected, "received ", received, " expected ", expected);
  ensure(data[0] == static_cast<float>(n), "sum ", data[0]);
}

/// Point-to-point: order per tag, any-size messages, a large buffered send overtaken by a
/// later one on another tag (no deadlock), recv_any from every sender.
template <comm::transport T>
void point_to_point(T& t) {
  const int n = t.size();
  if (n < 2) return;
  if (t.rank() == 0) {
    for (int k = 0; k < 5; ++k)
      t.send(1, 21, std::as_bytes(std::span(&k, 1)));
    std::vector<std::byte> big(3u << 20, std::byte{7});
    t.send(1, 22, big);  // received after the next one
    const std::string hello = "hello over any transport";
    t.send(1, 23, std::as_bytes(std::span(hello)));
  } else if (t.rank() == 1) {
    const auto got = t.recv_message(0, 23);
    ensure(std::string(reinterpret_cast<const char*>(got.data()), got.size()) ==
               "hello over any transport",
           "recv_message payload");
    std::vector<std::byte> big(3u << 20);
    t.recv(0, 22, big);
    ensure(std::all_of(big.begin(), big.end(), [](std::byte b) { return b == std::byte{7}; }),
           "big payload");
    for (int k = 0; k < 5; ++k) {
      int v = -1;
      t.recv(0, 21, std::as_writable_bytes(std::span(&v, 1)));
      ensure(v == k, "order per tag: got ", v, " expected ", k);
    }
  }
  // recv_any: every other rank sends 3 messages to rank 0, in order per sender.
  if (t.rank() != 0) {
    for (int k = 0; k < 3; ++k) {
      const int payload[2] = {t.rank(), k};
      t.send(0, 24, std::as_bytes(std::span(payload)));
    }
  } else {
    std::vector<int> next(static_cast<std::size_t>(n), 0);
    for (int m = 0; m < 3 * (n - 1); ++m) {
      const comm::message got = t.recv_any(24);
      int payload[2];
      ensure(got.bytes.size() == sizeof payload && got.tag == 24, "recv_any message");
      std::memcpy(payload, got.bytes.data(), sizeof payload);
      ensure(payload[0] == got.source, "source ", got.source, " payload ", payload[0]);
      ensure(payload[1] == next[static_cast<std::size_t>(got.source)]++, "order from ", got.source);
    }
  }
  comm::barrier(t);
}

/// Two threads share one endpoint, each ping-ponging on its own tag (the concept's
/// thread-safety promise); byte counters add up exactly.
template <comm::transport T>
void two_threads_one_endpoint(T& t) {
  const int n = t.size();
  if (n < 2 || t.rank() > 1) {
    comm::barrier(t);
    return;
  }
  constexpr int rounds = 50;
  const int peer = 1 - t.rank();
  const auto sent_before = t.bytes_sent_to(peer), received_before = t.bytes_received_from(peer);
  const auto ping_pong = [&](comm::tag_t tag) {
    for (int i = 0; i < rounds; ++i) {
      const std::uint64_t mine = (std::uint64_t{tag} << 32) | static_cast<std::uint64_t>(i);
      std::uint64_t theirs = 0;
      if (t.rank() == 0) {
        t.send(peer, tag, std::as_bytes(std::span(&mine, 1)));
        t.recv(peer, tag, std::as_writable_bytes(std::span(&theirs, 1)));
      } else {
        t.recv(peer, tag, std::as_writable_bytes(std::span(&theirs, 1)));
        t.send(peer, tag, std::as_bytes(std::span(&mine, 1)));
      }
      ensure(theirs == mine, "tag ", tag, " round ", i, " got ", theirs);
      std::uint64_t a = mine, b = 0;
      t.sendrecv(peer, std::as_bytes(std::span(&a, 1)), peer,
                 std::as_writable_bytes(std::span(&b, 1)), tag + 100);
      ensure(b == mine, "sendrecv tag ", tag, " round ", i);
    }
  };
  std::exception_ptr other_error;
  std::thread other([&] {
    try {
      ping_pong(32);
    } catch (...) {
      other_error = std::current_exception();
    }
  });
  ping_pong(31);
  other.join();
  if (other_error) std::rethrow_exception(other_error);
  const std::uint64_t per_tag = rounds * 2 * sizeof(std::uint64_t);
  ensure(t.bytes_sent_to(peer) - sent_before == 2 * per_tag, "sent ", t.bytes_sent_to(peer));
  ensure(t.bytes_received_from(peer) - received_before == 2 * per_tag, "received ",
         t.bytes_received_from(peer));
  comm::barrier(t);
}

/// Wrong sizes: recv of the wrong length names rank, peer and tag and consumes the message;
/// sendrecv too small / too large; allreduce of different lengths on every rank.
template <comm::transport T>
void size_mismatches(T& t) {
  const int n = t.size();
  if (n < 2) return;
  if (t.rank() == 0) {
    const std::uint64_t eight = 8;
    t.send(1, 3, std::as_bytes(std::span(&eight, 1)));
    const std::uint32_t next = 42;
    t.send(1, 3, std::as_bytes(std::span(&next, 1)));
  } else if (t.rank() == 1) {
    std::uint32_t four = 0;
    ensure_error([&] { t.recv(0, 3, std::as_writable_bytes(std::span(&four, 1))); },
                 errc::size_mismatch, {"rank 1", "peer 0", "tag 3", "8 bytes", "4 were expected"});
    t.recv(0, 3, std::as_writable_bytes(std::span(&four, 1)));  // the stream stays aligned
    ensure(four == 42, "message after the mismatch: ", four);
  }
  // sendrecv: rank 0 expects 4 bytes; rank 1 first takes rank 0's message (so no transport
  // may withdraw it on failure), then answers with 8 bytes (tag 4) or 2 bytes (tag 5).
  for (comm::tag_t tag : {4u, 5u}) {
    const std::size_t answer = tag == 4 ? 8 : 2;
    std::array<std::byte, 8> out{}, in{};
    if (t.rank() == 0) {
      ensure_error([&] { t.sendrecv(1, out, 1, std::span(in).first(4), tag); }, errc::size_mismatch,
                   {"rank 0", "peer 1", cat("tag ", tag), "4", "expected"});
    } else if (t.rank() == 1) {
      t.recv(0, tag, in);
      t.send(0, tag, std::span(out).first(answer));
    }
  }
  // Every rank passes its own length, so every rank sees a mismatch with its neighbour.
  std::vector<float> data(10 + static_cast<std::size_t>(t.rank()), 1.0f);
  ensure_error([&] { comm::allreduce(t, std::span(data)); }, errc::size_mismatch,
               {"every rank must pass the same length"});
  comm::barrier(t);
}

/// Rank 1 waits for a message rank 0 never sends: `errc::timeout` naming rank, peer and tag
/// within ~0.5 s; then every rank goes on (barrier) and finishes cleanly.
template <comm::transport T>
void timeout_names_peer_and_tag(T& t) {
  if (t.size() < 2) return;
  if (t.rank() == 1) {
    const double before = t.timeout_seconds();
    t.set_timeout(0.5);
    stopwatch watch;
    std::uint32_t v = 0;
    ensure_error([&] { t.recv(0, 77, std::as_writable_bytes(std::span(&v, 1))); }, errc::timeout,
                 {"rank 1", "peer 0", "tag 77", "timed out"});
    ensure_error([&] { (void)t.recv_any(78); }, errc::timeout, {"rank 1", "any peer", "tag 78"});
    const double elapsed = watch.seconds();
    ensure(elapsed >= 0.9 && elapsed < 3.0, "two 0.5 s timeouts took ", elapsed, " s");
    t.set_timeout(before);
  }
  comm::barrier(t);
}

// ---- parameter server: 1 server + 2 workers, sync, equals single-process training --------

inline const std::vector<embedding::table_spec>& ps_tables() {
  static const std::vector<embedding::table_spec> tables = {{"user", 40, 8}, {"item", 25, 4}};
  return tables;
}

/// Keys of worker w at step s for a table (with duplicates).
inline std::vector<std::uint64_t> batch_keys(std::size_t table, int w, int s) {
  const counter_rng rng{99, mix_ids(table, static_cast<std::uint64_t>(w * 1000 + s))};
  std::vector<std::uint64_t> keys(12);
  for (std::size_t i = 0; i < keys.size(); ++i)
    keys[i] = rng.below(i, ps_tables()[table].rows / 2 + 3 * static_cast<std::uint64_t>(w));
  return keys;
}

/// Gradient of 0.5 (row − target(key))², weighted per occurrence: depends on the pulled rows.
inline matrix<float> batch_grads(std::size_t table, std::span<const std::uint64_t> keys,
                                 const matrix<float>& rows) {
  const std::size_t dim = ps_tables()[table].dim;
  matrix<float> g(keys.size(), dim);
  for (std::size_t i = 0; i < keys.size(); ++i)
    for (std::size_t c = 0; c < dim; ++c) {
      const float target = counter_rng{5, keys[i]}.uniform(c, -1.0f, 1.0f);
      g(i, c) = (rows(i, c) - target) * (0.5f + 0.1f * static_cast<float>(i % 3));
    }
  return g;
}

inline constexpr optim::adagrad ps_optimizer{.lr = 0.1f, .eps = 1e-8f, .initial_accumulator = 0.1f};

/// Single process: each step every worker computes on the same parameters; the per-worker
/// duplicate-summed gradients are concatenated in worker order and applied once.
inline embedding::local<optim::adagrad> ps_reference(int workers, int steps) {
  embedding::local<optim::adagrad> ref(ps_tables(), ps_optimizer);
  for (int s = 0; s < steps; ++s)
    for (std::size_t table = 0; table < ps_tables().size(); ++table) {
      const std::size_t dim = ps_tables()[table].dim;
      std::vector<std::uint64_t> all_keys;
      std::vector<float> all_grads;
      for (int w = 0; w < workers; ++w) {
        const auto keys = batch_keys(table, w, s);
        matrix<float> rows(keys.size(), dim);
        ref.gather(table, keys, rows);
        const auto g = batch_grads(table, keys, rows);
        const auto summed = optim::sum_duplicates(keys, g);
        all_keys.insert(all_keys.end(), summed.keys.begin(), summed.keys.end());
        all_grads.insert(all_grads.end(), summed.grads.flat().begin(), summed.grads.flat().end());
      }
      ref.apply_gradients(table, all_keys,
                          matrix_view<const float>(all_grads.data(), all_keys.size(), dim));
    }
  return ref;
}

/// On 3 ranks (`--servers 1`: ranks 0-1 train, rank 2 serves): 4 sync steps of pull/push
/// through `embedding::sharded`, then worker 0 pulls every row and compares bitwise with
/// `embedding::local` trained in this process. Other world sizes: nothing to do.
template <comm::transport T>
void ps_sync_equals_local(T& t) {
  if (t.size() != 3) return;
  const char* argv[] = {"test", "--servers", "1"};
  const ps::layout roles = mpi::layout_from_args(3, argv, t.size());
  ensure(roles.workers() == 2 && roles.is_server(2), "roles: ", roles.describe());
  const ps::shard_map map(roles, ps_tables());
  const int steps = 4;
  if (roles.is_server(t.rank())) {
    ps::server<optim::adagrad, ps::sync> server(map, roles.server_index(t.rank()), ps_optimizer);
    server.serve(t);
    ensure(server.stats().push_requests == static_cast<std::uint64_t>(2 * steps * 2),
           "push requests ", server.stats().push_requests);
    return;
  }
  const int w = roles.worker_index(t.rank());
  embedding::sharded<optim::adagrad, ps::sync, T> store(t, map);
  for (int s = 0; s < steps; ++s)
    for (std::size_t table = 0; table < ps_tables().size(); ++table) {
      const auto keys = batch_keys(table, w, s);
      matrix<float> rows(keys.size(), ps_tables()[table].dim);
      store.gather(table, keys, rows);
      store.apply_gradients(table, keys, batch_grads(table, keys, rows));
    }
  if (w == 0) {
    const auto ref = ps_reference(roles.workers(), steps);
    for (std::size_t table = 0; table < ps_tables().size(); ++table) {
      std::vector<std::uint64_t> all(ps_tables()[table].rows);
      for (std::size_t k = 0; k < all.size(); ++k)
        all[k] = k;
      matrix<float> rows(all.size(), ps_tables()[table].dim);
      store.gather(table, all, rows);
      const auto expected = ref.weights(table);
      ensure(rows.flat().size() == expected.size(), "table ", table, " size");
      ensure(std::memcmp(rows.flat().data(), expected.data(), expected.size() * 4) == 0, "table ",
             table, " differs from single-process training");
    }
  }
  store.shutdown();
}

}  // namespace mpi_suite

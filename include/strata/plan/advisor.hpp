#pragma once
/// strata::plan — which strategy and compressor for a model on a cluster.
///
/// A cost model in two parts:
/// - what does not depend on the network, *measured*: each candidate (strategy × compressor)
///   is trained here for a few steps with no link emulation (a probe), which gives the step's
///   compute and in-process work, and the exact bytes each worker sends to workers and servers
///   and receives from servers, and each server's bytes;
/// - the network, *modelled* per link with α–β costs on one full-duplex interface per host (the
///   cluster `thread_world` emulates with `link_model::per_rank_nic`): a phase whose messages
///   all cross one interface takes latency × rounds + bytes / bandwidth, the busiest interface
///   (a worker's, or the busiest server's) setting the pace.
///
///   allreduce: dense ring (2(N−1)·⌈P / (N·chunk)⌉ rounds; the trainer's rank-ordered sum:
///              N rounds) + the touched rows' all-gather (one round; each worker's interface
///              carries its blob to N−1 peers)
///   ps:        pull (request + reply: 2 rounds, bytes = max(worker in, busiest server out))
///              + push (1 round: servers send no acknowledgement; max(worker out, server in))
///   hybrid:    the dense ring beside the rows' pull, after their push
///
/// Step time = the probe's step without its wait on the servers + the exchange: push, then the
/// ring and the next step's pull side by side (the trainer begins that pull right after the
/// push) — or the ring plus the wait on the servers when their work takes longer than their
/// transfers (servers work while transfers run). The candidate with the lowest predicted step
/// time is advised. Times are per host: a probe of W
/// workers as threads on C cores runs each worker on C / W of a core, so its times are divided by
/// max(1, W / C) (hosts are taken to have this machine's cores). Accuracy is checked against
/// emulated runs in docs/strategy-guide.md (scripts/experiments.py) and
/// tests/plan/test_advisor.cpp.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"

namespace strata::plan {

/// The cluster's network: every host has one full-duplex interface of this bandwidth.
struct network {
  double bandwidth_bytes_per_second = 1.25e9;  ///< 10 Gbit/s
  double latency_seconds = 50e-6;
};

/// One candidate, measured by a probe (per step, per host: see the header comment).
struct measured_step {
  std::string strategy;  ///< "allreduce", "ps" or "hybrid"
  std::string codec;     ///< the compressor's name, for the report
  int workers = 1;
  int servers = 0;
  double local_seconds = 0;  ///< step time without a network
  /// Of which a worker spends waiting on the servers' work (its pull and push phases): on a
  /// network the servers do it while the transfers run, so it overlaps them.
  double server_wait_seconds = 0;
  double ring_bytes = 0;        ///< sent by one worker to the other workers
  double dense_ring_bytes = 0;  ///< of which the dense ring allreduce (its payload)
  double push_bytes = 0;        ///< sent by one worker to the servers
  double pull_bytes = 0;        ///< received by one worker from the servers
  double server_in_bytes = 0;   ///< received by the busiest server
  double server_out_bytes = 0;  ///< sent by the busiest server
  std::size_t chunk_bytes = std::size_t{1} << 20;  ///< ring_allreduce's message size
  /// The dense sum is the trainer's rank-ordered one (deterministic, lossless codec): segments
  /// sent straight to their owners (one round), then the ring's all-gather (N−1 rounds).
  bool rank_ordered_sum = false;
};

struct prediction {
  measured_step probe;
  double network_seconds = 0;
  double step_seconds = 0;
  double worker_bytes = 0;           ///< one worker's sent + received
  double busiest_machine_bytes = 0;  ///< the busiest worker or server, sent + received
  double latency_rounds = 0;
};

namespace detail {

inline void check_probe(const measured_step& m) {
  STRATA_EXPECTS(m.strategy == "allreduce" || m.strategy == "ps" || m.strategy == "hybrid",
                 "plan::predict: strategy must be allreduce, ps or hybrid, got '", m.strategy, "'");
  STRATA_EXPECTS(m.workers >= 1, "plan::predict: ", m.strategy, " probe has ", m.workers,
                 " workers; it needs at least one");
  STRATA_EXPECTS(m.strategy == "allreduce" || m.servers >= 1, "plan::predict: ", m.strategy,
                 " needs at least one server, the probe has ", m.servers);
  const double values[] = {m.local_seconds,    m.server_wait_seconds, m.ring_bytes,
                           m.dense_ring_bytes, m.push_bytes,          m.pull_bytes,
                           m.server_in_bytes,  m.server_out_bytes};
  for (double v : values)
    STRATA_EXPECTS(std::isfinite(v) && v >= 0, "plan::predict: ", m.strategy, "/", m.codec,
                   ": a probe's times and bytes must be finite and >= 0 (got ", v,
                   "); re-run the probe");
  STRATA_EXPECTS(m.chunk_bytes >= 1, "plan::predict: chunk_bytes must be at least 1");
  STRATA_EXPECTS(m.server_wait_seconds <= m.local_seconds, "plan::predict: ", m.strategy, "/",
                 m.codec, ": the time waiting on servers (", m.server_wait_seconds,
                 " s) cannot exceed the step (", m.local_seconds, " s)");
}

}  // namespace detail

/// Predicted step time and bytes of one probed candidate on `net`.
[[nodiscard]] inline prediction predict(const measured_step& m, const network& net) {
  detail::check_probe(m);
  STRATA_EXPECTS(
      std::isfinite(net.bandwidth_bytes_per_second) && net.bandwidth_bytes_per_second > 0,
      "plan::predict: bandwidth must be > 0 bytes/s, got ", net.bandwidth_bytes_per_second);
  STRATA_EXPECTS(std::isfinite(net.latency_seconds) && net.latency_seconds >= 0,
                 "plan::predict: latency must be >= 0 s, got ", net.latency_seconds);
  prediction p;
  p.probe = m;
  const double bw = net.bandwidth_bytes_per_second;
  const double n = m.workers;
  double rounds = 0, transfer = 0, pull_seconds = 0, push_seconds = 0;
  const bool ring = m.strategy != "ps" && m.workers > 1;
  const bool servers = m.strategy != "allreduce";
  if (ring) {
    // Each ring step sends one chunk right and receives one from the left at once: the
    // interface's two sides carry the worker's ring bytes in parallel.
    if (m.rank_ordered_sum) {
      rounds += n;
    } else {
      const double per_column = n * static_cast<double>(m.chunk_bytes);
      const double columns =
          std::max(1.0, std::ceil(m.dense_ring_bytes / (2 * (n - 1) / n) / per_column));
      rounds += 2 * (n - 1) * columns;
    }
    if (m.strategy == "allreduce") rounds += 1;  // the touched rows' all-gather
    transfer += m.ring_bytes / bw;
  }
  const double ring_seconds = rounds * net.latency_seconds + transfer;
  if (servers) {
    rounds += 3;  // pull request + reply, push (a server acknowledges no push)
    pull_seconds = 2 * net.latency_seconds + std::max(m.pull_bytes, m.server_out_bytes) / bw;
    push_seconds = net.latency_seconds + std::max(m.push_bytes, m.server_in_bytes) / bw;
  }
  p.latency_rounds = rounds;
  p.network_seconds = ring_seconds + pull_seconds + push_seconds;
  // The trainer begins the next step's pull right after the push, so under hybrid the pull
  // runs while the dense ring does; the servers work while their transfers run.
  const double exchange = push_seconds + std::max(ring_seconds, pull_seconds);
  p.step_seconds = m.local_seconds - m.server_wait_seconds +
                   std::max(exchange, ring_seconds + m.server_wait_seconds);
  p.worker_bytes = 2 * m.ring_bytes + m.push_bytes + m.pull_bytes;
  p.busiest_machine_bytes = std::max(p.worker_bytes, m.server_in_bytes + m.server_out_bytes);
  return p;
}

/// The candidates ranked by predicted step time, and why the first one wins.
struct advice {
  std::vector<prediction> ranked;  ///< fastest first
  std::string reason;
};

[[nodiscard]] inline advice advise(std::span<const measured_step> candidates, const network& net) {
  STRATA_EXPECTS(!candidates.empty(), "plan::advise: no candidates to compare");
  advice a;
  for (const auto& m : candidates)
    a.ranked.push_back(predict(m, net));
  std::stable_sort(a.ranked.begin(), a.ranked.end(), [](const prediction& x, const prediction& y) {
    return x.step_seconds < y.step_seconds;
  });
  const auto& best = a.ranked.front();
  const auto ms = [](double s) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g ms", 1e3 * s);
    return std::string(buf);
  };
  const auto mb = [](double b) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.3g MB", b / 1e6);
    return std::string(buf);
  };
  const double net_share = best.step_seconds > 0 ? best.network_seconds / best.step_seconds : 0;
  a.reason =
      cat(best.probe.strategy, " with ", best.probe.codec, ": ", ms(best.step_seconds),
          " per step (", ms(best.probe.local_seconds), " computing, ", ms(best.network_seconds),
          " on the network: ", net_share >= 0.5 ? "network-bound" : "compute-bound", "; ",
          mb(best.busiest_machine_bytes), " through the busiest interface)");
  if (a.ranked.size() > 1) {
    const auto& next = a.ranked[1];
    a.reason += cat("; next: ", next.probe.strategy, " with ", next.probe.codec, " at ",
                    ms(next.step_seconds));
    if (next.probe.strategy != "allreduce" &&
        next.probe.server_in_bytes + next.probe.server_out_bytes > next.worker_bytes)
      a.reason += cat(" (its busiest server carries ",
                      mb(next.probe.server_in_bytes + next.probe.server_out_bytes), " per step)");
  }
  return a;
}

}  // namespace strata::plan

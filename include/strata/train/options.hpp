/// @file options.hpp
/// Settings and results of a training run.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "strata/comm/thread_world.hpp"
#include "strata/core/error.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/server.hpp"

namespace strata::train {

/// What the divergence guard does with a step whose loss or gradients are not finite.
enum class divergence_policy {
  stop,        ///< errc::diverged naming the step, worker, tensor and last good checkpoint
  skip_batch,  ///< the worker's batch contributes zero gradients; counted and logged
};

/// Settings of a trainer (a value type; validated by `check()`).
struct trainer_options {
  int workers = 4;         ///< training ranks
  int servers = 2;         ///< PS strategies: dedicated server ranks; 0 = co-located shards
  int server_threads = 1;  ///< threads of each server's oneTBB arena
  ps::partition_kind partition = ps::partition_kind::hash;
  std::size_t batch = 256;  ///< samples per worker and step (global batch = batch · workers)
  std::size_t epochs = 1;
  std::size_t max_steps = 0;  ///< stop after this many steps (0 = epochs · steps per epoch)
  std::uint64_t seed = 1;     ///< data order, embedding and dense initialisation
  /// Sharded sources (data::ctr_files): shards each epoch's chunks are dealt into (0: one per
  /// worker, so each worker reads only its own). The example order depends on the seed and
  /// this count, not on the workers: equal data_shards give the same global batches at every
  /// worker count dividing it (the in-memory ctr_dataset ignores it: its order never depends
  /// on the workers).
  std::size_t data_shards = 0;
  /// Sharded sources: examples shuffled together within a shard (0: the source's default,
  /// data::ctr_files::default_shuffle_window); resident memory grows with it.
  std::size_t shuffle_window = 0;
  /// Sum worker contributions in rank order everywhere (dense allreduce included), so sync
  /// training gives bitwise-identical parameters under every strategy for a given worker count.
  bool deterministic = true;
  std::size_t dense_row = 256;  ///< dense parameters are updated (and served) in rows of this many
  std::size_t eval_every = 0;   ///< evaluate every this many steps (0 = at the end only)
  std::size_t eval_max_samples = 0;        ///< cap on evaluated samples (0 = whole eval set)
  std::filesystem::path checkpoint_dir{};  ///< empty = no checkpoints
  std::size_t checkpoint_every = 0;        ///< steps between checkpoints (0 = only at the end)
  bool resume = false;                     ///< start from the latest checkpoint in checkpoint_dir
  /// Start from this checkpoint (a step-N folder, or a checkpoint directory's `latest`) and
  /// write new checkpoints into checkpoint_dir — the way out of a damaged `latest`.
  std::filesystem::path resume_from{};
  /// A timeline of the run as a Chrome / Perfetto trace (core/trace.hpp): per rank, spans of
  /// each step's phases (data, pull, compute, allreduce, push), evaluations and checkpoints, and
  /// a counter of the MiB it sent. Threads: one file; one process per rank (MPI): each rank
  /// writes <stem>.rank<R><extension>. Empty: no trace.
  std::filesystem::path trace_file{};
  double timeout_seconds = 300;              ///< transport timeout (a peer that stops answering)
  comm::link_model link{};                   ///< emulated network between ranks
  std::vector<double> send_delay_seconds{};  ///< per-rank straggler emulation
  /// Per-worker compute slowdown (a straggler on a slower machine): worker w's forward,
  /// backward and optimizer work takes compute_slowdown[w] times as long (it waits
  /// (factor − 1) × its measured compute time after computing). Empty = none; else one entry
  /// per worker, each ≥ 1. Results are unchanged (only time moves).
  std::vector<double> compute_slowdown{};
  int fail_rank = -1;              ///< fault rehearsal (threads): this rank fails ...
  std::uint64_t fail_on_send = 0;  ///< ... on its n-th send, and the whole run stops with the error
  /// Fault plan of the in-process world (threads): drop, delay, corrupt or kill a rank's n-th
  /// send of a phase (pull, push, allreduce, checkpoint, …; comm/fault.hpp). A plan turns on
  /// per-message checksums and sends pulls as messages (no in-process pulls). Runs under
  /// MPI refuse a plan (they rehearse a dead process: comm::crash_after, ctr_train's
  /// --crash-phase).
  std::vector<comm::fault> faults{};
  /// Per-message checksums in the in-process world without a fault plan (off by default: see
  /// docs/reliability.md for their cost).
  bool message_checksums = false;
  bool fp16_pulls = false;  ///< PS pulls travel as fp16
  /// PS pulls read the servers' rows in-process when every rank is a thread of this process
  /// and nothing is rehearsed on the messages (no emulated link, straggler or injected fault):
  /// no request/reply messages, pushes stay messages, the same rows (results unchanged), but
  /// pull bytes no longer show in the traffic columns. Off: pulls cross thread_world as
  /// messages, as they would cross a network.
  bool in_process_pulls = true;
  /// Uniform init half-width of every embedding row; 0 = DLRM's rule, ±sqrt(1/rows) per table
  /// (±0.01 for tables without a row bound).
  float embedding_init_scale = 0.0f;
  bool progress = true;  ///< live progress line on stderr
  /// Stop at the first step whose loss, dense gradients or row gradients are not finite,
  /// before anything of it leaves the worker (errc::diverged naming the step, the worker, the
  /// tensor and the last good checkpoint). Costs one vectorised scan of the step's gradients.
  bool divergence_guard = true;
  /// What the guard does with a non-finite step: stop the run (the default), or drop the
  /// worker's batch — its dense and row gradients become zeros, so the step's collectives and
  /// pushes still run and nothing non-finite leaves the worker — count it
  /// (train_report::skipped_batches) and go on. A dropped batch still moves a stateful
  /// optimizer's rows by their momentum (Adam), not SGD's or Adagrad's. Ten non-finite steps
  /// in a row on one worker stop the run as under `stop`: the model itself is not finite any
  /// more (weights overflowed by the learning rate), no batch is to blame.
  divergence_policy on_divergence = divergence_policy::stop;
  /// Log a warning when a step's loss exceeds this many times its running mean (0 = never).
  double blowup_warn_factor = 10;

  void check() const {
    STRATA_EXPECTS(workers >= 1, "trainer: workers must be ≥ 1, got ", workers);
    STRATA_EXPECTS(servers >= 0, "trainer: servers must be ≥ 0 (0 = co-located), got ", servers);
    STRATA_EXPECTS(server_threads >= 1, "trainer: server_threads must be ≥ 1, got ",
                   server_threads);
    STRATA_EXPECTS(batch >= 1, "trainer: batch must be ≥ 1");
    STRATA_EXPECTS(epochs >= 1 || max_steps >= 1, "trainer: set epochs or max_steps");
    STRATA_EXPECTS(dense_row >= 1, "trainer: dense_row must be ≥ 1");
    STRATA_EXPECTS(timeout_seconds > 0, "trainer: timeout_seconds must be positive");
    STRATA_EXPECTS(!resume || resume_from.empty(),
                   "trainer: resume and resume_from both set; resume_from names the checkpoint, "
                   "drop resume");
    STRATA_EXPECTS(blowup_warn_factor == 0 || blowup_warn_factor > 1,
                   "trainer: blowup_warn_factor must be 0 (off) or > 1, got ", blowup_warn_factor);
    STRATA_EXPECTS(
        compute_slowdown.empty() || compute_slowdown.size() == static_cast<std::size_t>(workers),
        "trainer: compute_slowdown needs one factor per worker (", workers, "), got ",
        compute_slowdown.size());
    for (std::size_t w = 0; w < compute_slowdown.size(); ++w)
      STRATA_EXPECTS(std::isfinite(compute_slowdown[w]) && compute_slowdown[w] >= 1.0,
                     "trainer: compute_slowdown[", w, "] must be a finite factor ≥ 1, got ",
                     compute_slowdown[w]);
    STRATA_EXPECTS(!resume || !checkpoint_dir.empty(),
                   "trainer: resume needs a checkpoint directory (--checkpoint-dir)");
  }
};

/// Evaluation on the held-out set after `step` steps.
struct eval_point {
  std::size_t step = 0;
  double auc = 0, logloss = 0, accuracy = 0;
  std::size_t samples = 0;
  /// Worker 0's training time until this point (its step phases summed: data, pull, compute,
  /// allreduce, push — evaluations excluded), for time-to-AUC curves.
  double train_seconds = 0;
};

/// Phases of a worker's step, for the time split.
enum phase : std::size_t {
  data_phase,
  pull_phase,
  compute_phase,
  allreduce_phase,
  push_phase,
  phase_count
};
inline constexpr std::array<const char*, phase_count> phase_names = {"data", "pull", "compute",
                                                                     "allreduce", "push"};

/// What a run did.
struct train_report {
  std::string strategy;
  int workers = 0, servers = 0;
  std::size_t first_step = 0;  ///< > 0 when resumed
  std::size_t steps = 0;       ///< steps completed (global step count at the end)
  std::size_t samples = 0;     ///< samples trained in this run
  double seconds = 0, samples_per_second = 0;
  double train_loss = 0;  ///< mean logloss of worker 0's batches in the last segment
  double train_auc = 0;   ///< AUC of worker 0's batches in the last segment
  std::vector<eval_point> evals;
  std::array<double, phase_count> phase_seconds{};  ///< worker 0
  std::uint64_t bytes_worker_to_worker = 0;         ///< allreduce / sparse exchange traffic
  std::uint64_t bytes_worker_to_server = 0;         ///< PS requests (pulls, pushes)
  std::uint64_t bytes_server_to_worker = 0;         ///< PS replies
  std::vector<ps::shard_stats> server_stats;
  std::uint64_t dense_checksum = 0;      ///< of the final dense parameters
  std::uint64_t embedding_checksum = 0;  ///< of every (table, key, row), order-independent
  /// Batches dropped by divergence_policy::skip_batch, summed over this process's workers.
  std::size_t skipped_batches = 0;
  /// Faults of trainer_options::faults that acted (threaded runs).
  std::size_t faults_fired = 0;
};

}  // namespace strata::train

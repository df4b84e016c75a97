/// @file run_checkpoints.hpp
/// One training run's checkpoints, apart from what the ranks hold: which files a checkpoint of
/// the run has (`checkpoint_files`), and `run_checkpoints` — the directory's claim and lock,
/// when a checkpoint is due, the staged write (every rank writes its part into step-N.tmp/,
/// barriers, rank 0 publishes and rotates), where a resume reads from and the checks before
/// it, and the step of the last good checkpoint (the divergence guard names it).
///
/// The trainers say only what their ranks hold: a function that writes this rank's files into
/// the staging folder, and a loader that takes rows back (checkpoint_rows.hpp).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/core/error.hpp"
#include "strata/core/progress.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/checkpoint_dir.hpp"
#include "strata/train/checkpoint_rows.hpp"
#include "strata/train/options.hpp"

namespace strata::train {

/// The files of one checkpoint beside `state.ckpt` (the run's identity), by who writes them.
struct checkpoint_files {
  bool replica = false;    ///< rows-worker-0.ckpt: worker 0's dense rows (and tables it holds)
  bool residuals = false;  ///< worker-<w>.ckpt: each worker's compressor residuals
  int workers = 0;
  int servers = 0;  ///< rows-server-<s>.ckpt: each parameter server's stripe of rows

  [[nodiscard]] static std::string identity() { return "state.ckpt"; }
  [[nodiscard]] static std::string replica_file() { return "rows-worker-0.ckpt"; }
  [[nodiscard]] static std::string residual_file(int worker) {
    return cat("worker-", worker, ".ckpt");
  }
  [[nodiscard]] static std::string stripe_file(int server) {
    return cat("rows-server-", server, ".ckpt");
  }
  /// Every file but state.ckpt, as checkpoint_meta::files lists them.
  [[nodiscard]] std::vector<std::string> names() const {
    std::vector<std::string> files;
    if (replica) files.push_back(replica_file());
    if (residuals)
      for (int w = 0; w < workers; ++w)
        files.push_back(residual_file(w));
    for (int s = 0; s < servers; ++s)
      files.push_back(stripe_file(s));
    return files;
  }
};

/// The checkpoints of one run (trainer_options' checkpoint_dir, checkpoint_every, resume,
/// resume_from). Ranks of one process share it; `write` is called by every rank of the world.
class run_checkpoints {
 public:
  static constexpr std::size_t none = static_cast<std::size_t>(-1);
  /// Published checkpoints kept in the directory (older ones are removed).
  static constexpr std::size_t keep = 2;

  explicit run_checkpoints(const trainer_options& options)
      : run_checkpoints(options.checkpoint_dir, options.checkpoint_every, options.resume,
                        options.resume_from) {}
  /// Checkpoints into `dir` (empty: none) every `every` steps (0: only at the end); resume
  /// from its `latest` (`resume`) or from the checkpoint `resume_from`.
  run_checkpoints(std::filesystem::path dir, std::size_t every, bool resume,
                  std::filesystem::path resume_from)
      : dir_(std::move(dir)),
        resume_from_(std::move(resume_from)),
        every_(every),
        resume_(resume) {}

  [[nodiscard]] bool enabled() const noexcept { return !dir_.empty(); }
  [[nodiscard]] bool resuming() const noexcept { return resume_ || !resume_from_.empty(); }

  /// The last step of the segment that starts at `step` when training ends at `end`: the
  /// next checkpoint's step, or `end`.
  [[nodiscard]] std::size_t segment_end(std::size_t step, std::size_t end) const noexcept {
    if (enabled() && every_ != 0) end = std::min(end, (step / every_ + 1) * every_);
    return end;
  }
  /// Whether a checkpoint is written after step `step` of a run of `total` steps.
  [[nodiscard]] bool due(std::size_t step, std::size_t total) const noexcept {
    return enabled() && (step == total || (every_ != 0 && step % every_ == 0));
  }

  /// Takes the directory's lock for this run (none without a directory) and refuses a fresh
  /// run into a directory holding another run's checkpoints (checkpoint_dir.hpp). Called by
  /// the process that publishes (the one hosting rank 0), before training.
  [[nodiscard]] std::optional<checkpoint_lock> claim() const {
    if (!enabled()) return std::nullopt;
    std::optional<checkpoint_lock> lock(std::in_place, dir_);
    if (!lock->stale_holder().empty())
      log_line(cat("checkpoint directory ", dir_.string(), ": the previous job (",
                   lock->stale_holder(), ") ended without releasing it (killed?); this run takes ",
                   "it over"));
    if (!resume_)
      checkpoint_directory(dir_).expect_fresh(
          resume_from_.empty() ? std::nullopt : std::optional<std::filesystem::path>(resume_from_));
    return lock;
  }

  /// Every rank writes its part of the checkpoint of `step`: rank 0 prepares step-N.tmp/, then
  /// `write_part(staged_folder)` runs on every rank; once all parts are there, rank 0 seals
  /// them into `identity` (the run's meta, listing the files: their sizes and checksums and
  /// this run's id are added) as state.ckpt, publishes the folder, points `latest` at it and
  /// removes all but the `keep` newest (barriers in between, so a checkpoint is whole or
  /// absent). `identity` is used on rank 0 only.
  template <comm::transport T, class WritePart>
  void write(T& t, std::size_t step, checkpoint_meta identity, WritePart&& write_part) const {
    const checkpoint_directory dir(dir_);
    if (t.rank() == 0) dir.prepare(step);
    comm::barrier(t, comm::tags::checkpoint);
    std::forward<WritePart>(write_part)(dir.staging(step));
    comm::barrier(t, comm::tags::checkpoint);
    if (t.rank() == 0) {
      identity.seals.clear();
      for (const auto& name : identity.files)
        identity.seals.push_back(seal_of(dir.staging(step) / name));
      identity.run_id = run_id_.load();
      identity.write(dir.staging(step) / checkpoint_files::identity());
      dir.publish(step, keep);
    }
    last_step_.store(step);
    comm::barrier(t, comm::tags::checkpoint);
  }

  /// The checkpoint a resume reads: `resume_from`, or the one `latest` of the checkpoint
  /// directory names.
  [[nodiscard]] std::filesystem::path latest() const {
    return checkpoint_directory(resume_from_.empty() ? dir_ : resume_from_).latest();
  }
  /// Opens the checkpoint `from` to resume `run` (its identity at step 0): refused
  /// (errc::corrupt_data) when written for another model, tables, seed or optimizers, or when
  /// a file it lists is missing or one it does not list is there. Returns what it recorded.
  [[nodiscard]] checkpoint_meta open(const std::filesystem::path& from,
                                     const checkpoint_meta& run) const {
    auto saved = checkpoint_meta::read(from / checkpoint_files::identity());
    saved.check_resumable_as(run, from);
    saved.check_complete(from);
    return saved;
  }
  /// The residuals file of `worker` in checkpoint `from`, when it carries over: the worker
  /// count is the checkpoint's and the file is there (residuals belong to a worker).
  [[nodiscard]] static std::optional<checkpoint_reader> residuals(const std::filesystem::path& from,
                                                                  const checkpoint_meta& saved,
                                                                  int worker, int workers) {
    const auto file = from / checkpoint_files::residual_file(worker);
    std::optional<checkpoint_reader> reader;
    if (saved.workers == workers && std::filesystem::exists(file)) reader.emplace(file);
    return reader;
  }
  /// Records that this run resumed at `saved`'s step (rank 0 logs it).
  void resumed(int rank, const std::filesystem::path& from, const checkpoint_meta& saved) const {
    if (saved.run_id != 0) run_id_.store(saved.run_id);
    if (rank == 0)
      log_line(cat("resumed from ", from.string(), " at step ", saved.step,
                   saved.run_id != 0 ? cat(" (run ", hex16(saved.run_id), ")") : std::string()));
    last_step_.store(static_cast<std::size_t>(saved.step));
  }
  /// The id this run's checkpoints record: drawn at construction, the resumed checkpoint's
  /// after `resumed` (so a run and its continuations share one id).
  [[nodiscard]] std::uint64_t run_id() const noexcept { return run_id_.load(); }

  /// Step of the newest checkpoint written or resumed from in this run (`none` if neither).
  [[nodiscard]] std::size_t last_step() const noexcept { return last_step_.load(); }
  /// A sentence naming the last good checkpoint and how to resume from it, or saying there
  /// is none.
  [[nodiscard]] std::string last_good() const {
    const std::size_t saved = last_step();
    if (saved == none)
      return "No checkpoint was written in this run (--checkpoint-dir with --checkpoint-every "
             "keeps one).";
    return cat("The last good checkpoint is ", (dir_ / checkpoint_directory::name(saved)).string(),
               " (step ", saved, "): resume from it (--resume).");
  }

 private:
  std::filesystem::path dir_, resume_from_;
  std::size_t every_ = 0;
  bool resume_ = false;
  mutable std::atomic<std::size_t> last_step_{none};
  /// Replaced by `resumed` (every rank of a process stores the same value).
  mutable std::atomic<std::uint64_t> run_id_{fresh_id()};

  static std::uint64_t fresh_id() {
    std::random_device entropy;
    const std::uint64_t id = (std::uint64_t{entropy()} << 32) ^ entropy();
    return id == 0 ? 1 : id;
  }
};

}  // namespace strata::train

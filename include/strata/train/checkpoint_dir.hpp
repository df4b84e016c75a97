/// @file checkpoint_dir.hpp
/// A directory of training checkpoints: one `step-N/` folder per checkpoint and a `latest`
/// file naming the newest. A checkpoint is staged in `step-N.tmp/` and published by renaming
/// it, then `latest` is replaced (write + rename), so a crash leaves the previous checkpoint
/// and pointer whole; publishing keeps the `keep` newest checkpoints.
///
/// Ownership: a job holds `checkpoint_lock` on the directory for its whole run (an flock on
/// `DIR/lock`, which also records the holder's pid, host and start time): a second job on the
/// same directory is refused naming the holder, and a lock left by a job that died is
/// detected (the kernel released the flock) and reported. A fresh run (no resume) refuses a
/// directory that already holds checkpoints: only the run that continues them (--resume)
/// writes there, so rotation never removes another run's checkpoints and `latest` always
/// names this run's newest.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <ctime>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"

namespace strata::train {

class checkpoint_directory {
 public:
  explicit checkpoint_directory(std::filesystem::path dir) : dir_(std::move(dir)) {
    STRATA_EXPECTS(!dir_.empty(), "checkpoint_directory: the directory name is empty");
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return dir_; }
  [[nodiscard]] static std::string name(std::size_t step) { return cat("step-", step); }
  /// Where the checkpoint of `step` is written before it is published.
  [[nodiscard]] std::filesystem::path staging(std::size_t step) const {
    return dir_ / (name(step) + ".tmp");
  }
  /// Creates the directory and an empty staging folder for `step` (a leftover one is removed).
  void prepare(std::size_t step) const {
    namespace fs = std::filesystem;
    fs::create_directories(dir_);
    fs::remove_all(staging(step));
    fs::create_directories(staging(step));
  }
  /// Publishes the staged checkpoint of `step`, points `latest` at it and removes all but the
  /// `keep` newest checkpoints.
  void publish(std::size_t step, std::size_t keep = 2) const {
    namespace fs = std::filesystem;
    STRATA_EXPECTS(keep >= 1, "checkpoint_directory: keep at least one checkpoint");
    STRATA_EXPECTS(fs::is_directory(staging(step)),
                   "checkpoint_directory: nothing staged for step ", step, " in ", dir_.string(),
                   " (call prepare first)");
    const fs::path final_dir = dir_ / name(step);
    fs::remove_all(final_dir);
    fs::rename(staging(step), final_dir);
    {
      std::ofstream latest(dir_ / "latest.tmp", std::ios::trunc);
      latest << name(step) << "\n";
      if (!latest.flush())
        fail(errc::io_error,
             cat("checkpoint_directory: cannot write ", (dir_ / "latest.tmp").string()));
    }
    fs::rename(dir_ / "latest.tmp", dir_ / "latest");
    const auto found = steps();
    for (std::size_t i = 0; i + keep < found.size(); ++i)
      fs::remove_all(dir_ / name(found[i]));
  }
  /// The published checkpoints' steps, oldest first.
  [[nodiscard]] std::vector<std::size_t> steps() const {
    namespace fs = std::filesystem;
    std::vector<std::size_t> found;
    if (!fs::is_directory(dir_)) return found;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      const auto file = entry.path().filename().string();
      if (!entry.is_directory() || file.rfind("step-", 0) != 0 || file.size() == 5) continue;
      if (!std::all_of(file.begin() + 5, file.end(), [](char c) { return c >= '0' && c <= '9'; }))
        continue;  // step-N.tmp and anything else that is not a published checkpoint
      found.push_back(static_cast<std::size_t>(std::stoull(file.substr(5))));
    }
    std::sort(found.begin(), found.end());
    return found;
  }
  /// The checkpoint to resume from: the directory itself when it is one checkpoint (holds
  /// state.ckpt), else the one `latest` names. A missing, empty or dangling `latest` is
  /// refused; when published checkpoints are there, the message names the newest one and how
  /// to resume from it.
  [[nodiscard]] std::filesystem::path latest() const {
    namespace fs = std::filesystem;
    if (fs::exists(dir_ / "state.ckpt")) return dir_;
    const auto found = steps();
    const std::string instead =
        found.empty()
            ? std::string(" and holds no checkpoint: train without --resume first")
            : cat("; its newest checkpoint is ", (dir_ / name(found.back())).string(),
                  ": resume from it with --resume-from ", (dir_ / name(found.back())).string());
    std::ifstream file(dir_ / "latest");
    std::string latest_name;
    if (!file)
      fail(errc::io_error, cat("no checkpoint to resume from in ", dir_.string(),
                               ": it has no 'latest' file", instead));
    if (!(file >> latest_name))
      fail(errc::corrupt_data,
           cat("checkpoint directory ", dir_.string(), ": 'latest' is empty", instead));
    if (!fs::is_directory(dir_ / latest_name))
      fail(errc::corrupt_data, cat("checkpoint directory ", dir_.string(), ": 'latest' names ",
                                   latest_name, ", which does not exist", instead));
    return dir_ / latest_name;
  }

  /// Refuses (errc::invalid_argument) to start a fresh run here when the directory already
  /// holds checkpoints (or a `latest`) of an earlier run: they would be overwritten step by
  /// step and rotated away. `resume_from`, when given, is the checkpoint the run continues: a
  /// directory holding only its lineage (resume_from inside it) is accepted.
  void expect_fresh(const std::optional<std::filesystem::path>& resume_from = {}) const {
    namespace fs = std::filesystem;
    const auto found = steps();
    if (found.empty() && !fs::exists(dir_ / "latest")) return;
    if (resume_from) {
      std::error_code ec;
      const auto parent = fs::weakly_canonical(resume_from->parent_path(), ec);
      if (!ec && parent == fs::weakly_canonical(dir_, ec)) return;
    }
    fail(errc::invalid_argument,
         cat("checkpoint directory ", dir_.string(), " already holds checkpoints of an earlier run",
             found.empty() ? std::string() : cat(" (newest ", name(found.back()), ")"),
             ": continue that run with --resume, or write this one into an empty directory "
             "(a fresh run here would overwrite and rotate them away)"));
  }

 private:
  std::filesystem::path dir_;
};

/// An exclusive claim of a checkpoint directory for one job's run (see the file comment).
/// Created by the process that publishes checkpoints (the one hosting rank 0); released when
/// destroyed, and by the kernel when the process dies.
class checkpoint_lock {
 public:
  /// Creates `dir` if needed and takes its lock; errc::io_error naming the holder when another
  /// live job holds it, or when the lock file cannot be created.
  explicit checkpoint_lock(const std::filesystem::path& dir) : path_(dir / "lock") {
    namespace fs = std::filesystem;
    std::error_code ec;
    fs::create_directories(dir, ec);
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0)
      fail(errc::io_error, cat("checkpoint directory ", dir.string(), ": cannot create ",
                               path_.string(), "; choose a directory you can write"));
    const std::string holder = read_record();
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      fd_ = -1;
      fail(errc::io_error,
           cat("checkpoint directory ", dir.string(), " is in use by another job (",
               holder.empty() ? std::string("holder unknown") : holder,
               "): two jobs writing one directory would overwrite each other's checkpoints; "
               "wait for it to end or choose another directory"));
    }
    if (!holder.empty()) stale_holder_ = holder;
    write_record();
  }
  checkpoint_lock(checkpoint_lock&& other) noexcept
      : path_(std::move(other.path_)),
        fd_(std::exchange(other.fd_, -1)),
        stale_holder_(std::move(other.stale_holder_)) {}
  checkpoint_lock(const checkpoint_lock&) = delete;
  checkpoint_lock& operator=(const checkpoint_lock&) = delete;
  checkpoint_lock& operator=(checkpoint_lock&&) = delete;
  ~checkpoint_lock() {
    if (fd_ < 0) return;
    // An empty record marks a clean release (the file stays: removing it could let two later
    // jobs lock two different files of one name).
    [[maybe_unused]] const int ignored = ::ftruncate(fd_, 0);
    ::close(fd_);
  }

  /// The record of a job that held the lock and died without releasing it (empty if none).
  [[nodiscard]] const std::string& stale_holder() const noexcept { return stale_holder_; }

 private:
  [[nodiscard]] std::string read_record() const {
    std::string text(256, '\0');
    const auto n = ::pread(fd_, text.data(), text.size(), 0);
    text.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
    while (!text.empty() && (text.back() == '\n' || text.back() == '\0'))
      text.pop_back();
    return text;
  }
  void write_record() const {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char when[32] = {};
    std::tm utc{};
    ::gmtime_r(&now, &utc);
    std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &utc);
    const std::string record = cat("pid ", ::getpid(), " on ", host, " since ", when, "\n");
    if (::ftruncate(fd_, 0) != 0 ||
        ::pwrite(fd_, record.data(), record.size(), 0) != static_cast<ssize_t>(record.size()))
      fail(errc::io_error, cat("cannot write the checkpoint lock ", path_.string()));
  }

  std::filesystem::path path_;
  int fd_ = -1;
  std::string stale_holder_;
};

}  // namespace strata::train

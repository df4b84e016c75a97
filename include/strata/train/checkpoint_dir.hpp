/// @file checkpoint_dir.hpp
/// A directory of training checkpoints: one `step-N/` folder per checkpoint and a `latest`
/// file naming the newest. A checkpoint is staged in `step-N.tmp/` and published by renaming
/// it, then `latest` is replaced (write + rename), so a crash leaves the previous checkpoint
/// and pointer whole; publishing keeps the `keep` newest checkpoints.
#pragma once

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <fstream>
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
  /// state.ckpt), else the one `latest` names.
  [[nodiscard]] std::filesystem::path latest() const {
    namespace fs = std::filesystem;
    if (fs::exists(dir_ / "state.ckpt")) return dir_;
    std::ifstream file(dir_ / "latest");
    std::string name;
    if (!(file >> name))
      fail(errc::io_error, cat("no checkpoint to resume from in ", dir_.string(),
                               " (no 'latest' file); train without --resume first"));
    if (!fs::is_directory(dir_ / name))
      fail(errc::corrupt_data, cat("checkpoint directory ", dir_.string(), ": 'latest' names ",
                                   name, ", which does not exist"));
    return dir_ / name;
  }

 private:
  std::filesystem::path dir_;
};

}  // namespace strata::train

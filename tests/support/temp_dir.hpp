// A fresh folder under the system temp dir for one test, removed with everything in it at
// scope exit. Shared by the tests that write files (data readers, checkpoints, rendezvous).
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>

namespace strata_test {

struct temp_dir {
  std::filesystem::path path;

  /// <temp>/strata_<prefix>_<pid>_<n>: unique per process and per call.
  explicit temp_dir(std::string_view prefix) {
    static std::atomic<int> counter{0};
    path = std::filesystem::temp_directory_path() /
           ("strata_" + std::string(prefix) + "_" + std::to_string(::getpid()) + "_" +
            std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  temp_dir(const temp_dir&) = delete;
  temp_dir& operator=(const temp_dir&) = delete;
  ~temp_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }

  /// Writes `text` to path / name and returns that path.
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return path / name;
  }
};

}  // namespace strata_test

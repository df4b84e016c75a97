// What the libFuzzer targets of tests/fuzz share: the input as a byte cursor, files in memory
// (a memfd named by /proc/self/fd/N, for readers that only take a path), a scratch folder for
// readers that take a folder, and the oracle: a strata::error of an expected code is the
// expected outcome of bad input; anything else is a finding (abort, so libFuzzer keeps the
// input as a crash-* artifact).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <span>
#include <string>
#include <system_error>

#include "strata/core/error.hpp"

namespace strata_fuzz {

/// Reports a finding and aborts (libFuzzer saves the input that got here).
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "\nstrata fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// Aborts unless `condition`: a broken contract of an input the reader accepted.
inline void require(bool condition, const char* what) {
  if (!condition) finding(what);
}

/// STRATA_FUZZ_VERBOSE=1 in the environment: every input's outcome is printed (to see which
/// path a seed takes: `fuzz_idx -runs=0 corpus/idx`).
inline bool verbose() {
  static const bool on = std::getenv("STRATA_FUZZ_VERBOSE") != nullptr;
  return on;
}
inline void note(const char* outcome) {
  if (verbose()) std::fprintf(stderr, "strata fuzz: %s\n", outcome);
}

/// A rejection is expected only with one of `codes` (the error code the header documents for
/// bad input of that kind); another code is a finding. An empty list accepts every code.
inline void expect_code(const strata::error& e, std::initializer_list<strata::errc> codes) {
  if (verbose()) std::fprintf(stderr, "strata fuzz: refused: %s\n", e.what());
  for (const strata::errc code : codes)
    if (e.code() == code) return;
  if (codes.size() == 0) return;
  finding(strata::cat("unexpected error code ", strata::to_string(e.code()), ": ", e.what()));
}

/// The fuzz input, read front to back; past its end every read gives zeros.
class input {
 public:
  input(const std::uint8_t* data, std::size_t size) : bytes_(data, size) {}
  std::uint8_t u8() { return at_ < bytes_.size() ? bytes_[at_++] : 0; }
  std::uint16_t u16() { return static_cast<std::uint16_t>(u8() | (u8() << 8)); }
  std::uint32_t u32() { return u16() | (std::uint32_t{u16()} << 16); }
  /// Up to `n` next bytes (fewer at the end).
  std::span<const std::uint8_t> take(std::size_t n) {
    const std::size_t k = std::min(n, bytes_.size() - at_);
    const auto piece = bytes_.subspan(at_, k);
    at_ += k;
    return piece;
  }
  /// Everything not read yet.
  std::span<const std::uint8_t> rest() { return take(bytes_.size() - at_); }
  [[nodiscard]] std::size_t rest_size() const noexcept { return bytes_.size() - at_; }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t at_ = 0;
};

/// One in-memory file for the whole process (memfd_create), rewritten by every run; readers
/// open it by path, /proc/self/fd/N (a fresh open file description, so each starts at 0).
class memory_file {
 public:
  memory_file() : fd_(::memfd_create("strata-fuzz", 0)) {
    if (fd_ < 0) finding("memfd_create failed (the fuzz targets need Linux >= 3.17)");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  memory_file(const memory_file&) = delete;
  memory_file& operator=(const memory_file&) = delete;

  /// Replaces the contents with `bytes`; returns the path to open.
  const std::string& write(std::span<const std::uint8_t> bytes) {
    if (::ftruncate(fd_, 0) != 0) finding("ftruncate of the memfd failed");
    std::size_t done = 0;
    while (done < bytes.size()) {
      const ssize_t n =
          ::pwrite(fd_, bytes.data() + done, bytes.size() - done, static_cast<off_t>(done));
      if (n <= 0) finding("pwrite to the memfd failed");
      done += static_cast<std::size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

/// A folder of this process under /dev/shm (memory; the system temp folder where there is no
/// /dev/shm), removed when the process exits normally.
class scratch_dir {
 public:
  scratch_dir() {
    std::error_code ec;
    const std::filesystem::path base = std::filesystem::is_directory("/dev/shm", ec)
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
    path_ = base / ("strata-fuzz-" + std::to_string(::getpid()));
    std::filesystem::create_directories(path_);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  ~scratch_dir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  [[nodiscard]] const std::filesystem::path& path() const noexcept { return path_; }

  /// Writes `bytes` to path()/name and returns that path.
  std::filesystem::path write(const std::string& name, std::span<const std::uint8_t> bytes) const {
    const auto file = path_ / name;
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) finding("cannot write " + file.string());
    return file;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace strata_fuzz

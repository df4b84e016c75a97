/// @file mapped_file.hpp
/// `mapped_file`: a whole file mapped read-only (POSIX mmap, MAP_SHARED), with page-range
/// hints to the kernel: read ahead (`will_need`) and drop from this process (`release`).
///
/// ```cpp
/// strata::mapped_file f("day_0.ctrb");
/// f.will_need(0, 1 << 20);            // start reading the first MiB from disk
/// use(f.bytes().subspan(0, 1 << 20));
/// f.release(0, 1 << 20);              // those pages leave this process's resident set
/// ```
#pragma once

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <utility>

#include "strata/core/error.hpp"

namespace strata {

/// A file mapped read-only. Pages are read from the page cache on first touch, never copied;
/// `release` drops a range from this process's resident set (the page cache keeps them, a
/// later touch maps them again), so a reader walking a file larger than memory keeps its
/// resident memory bounded. RAII, move-only. `bytes()` and the hints are safe from many
/// threads at once (the mapping never changes while the object lives).
class mapped_file {
 public:
  mapped_file() = default;
  /// Maps `path` whole. `remedy` ends the error messages (what the user should do).
  explicit mapped_file(const std::filesystem::path& path, std::string_view remedy = "") {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      fail(errc::io_error, cat("cannot open '", path.string(), "': ", std::strerror(errno),
                               remedy.empty() ? "" : "; ", remedy));
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      const int err = errno;
      ::close(fd);
      fail(errc::io_error, cat("cannot stat '", path.string(), "': ", std::strerror(err)));
    }
    size_ = static_cast<std::size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
      if (p == MAP_FAILED) {
        const int err = errno;
        ::close(fd);
        size_ = 0;
        fail(errc::io_error, cat("cannot map '", path.string(), "' (", st.st_size, " bytes): ",
                                 std::strerror(err), remedy.empty() ? "" : "; ", remedy));
      }
      data_ = static_cast<const std::byte*>(p);
    }
    ::close(fd);  // the mapping keeps the file
  }
  mapped_file(mapped_file&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  mapped_file& operator=(mapped_file&& other) noexcept {
    if (this != &other) {
      unmap();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;
  ~mapped_file() { unmap(); }

  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return {data_, size_}; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

  /// Asks the kernel to start reading [offset, offset + bytes) (asynchronous; a hint).
  void will_need(std::size_t offset, std::size_t bytes) const noexcept {
    advise(offset, bytes, MADV_WILLNEED, false);
  }
  /// Drops the whole pages inside [offset, offset + bytes) from this process's resident set
  /// (a hint with an effect: the next touch maps them again from the page cache or disk).
  void release(std::size_t offset, std::size_t bytes) const noexcept {
    advise(offset, bytes, MADV_DONTNEED, true);
  }

 private:
  /// madvise on the pages of the range: `inner` keeps only pages wholly inside it (release
  /// must not drop a neighbour's bytes), otherwise every page it touches.
  void advise(std::size_t offset, std::size_t bytes, int what, bool inner) const noexcept {
    if (data_ == nullptr || offset >= size_ || bytes == 0) return;
    if (bytes > size_ - offset) bytes = size_ - offset;
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    const auto base = reinterpret_cast<std::uintptr_t>(data_);  // page-aligned (mmap)
    std::size_t first = offset, last = offset + bytes;
    if (inner) {
      first = (first + page - 1) / page * page;
      if (last != size_)
        last = last / page * page;  // the file's tail page is ours alone
      else
        last = (last + page - 1) / page * page;
    } else {
      first = first / page * page;
      last = (last + page - 1) / page * page;
    }
    if (last <= first) return;
    ::madvise(reinterpret_cast<void*>(base + first), last - first, what);
  }
  void unmap() noexcept {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace strata

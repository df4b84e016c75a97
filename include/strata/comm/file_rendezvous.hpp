/// @file file_rendezvous.hpp
/// Hands a few bytes from one rank to the others through a file on a shared filesystem — the
/// bootstrap for a communicator whose ranks have no transport yet (e.g. an NCCL unique id
/// when the job is not launched by MPI).
///
/// ```cpp
/// const std::filesystem::path where = "/shared/job-4711/nccl.id";  // unique to this job
/// if (rank == 0) comm::publish_file(where, id_bytes);
/// else           comm::await_file(where, id_bytes, 60.0);
/// ```
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <system_error>
#include <thread>

#include <unistd.h>

#include "strata/core/error.hpp"

namespace strata::comm {

/// Publishes `bytes` as the file `path`: written to a temporary file beside it, flushed, then
/// renamed into place, so a reader sees either no file or the whole of it.
/// Refuses to overwrite: an existing `path` (a previous job's leftover, whose stale content a
/// reader could take) raises `errc::invalid_argument` — use a path unique to the job.
/// Raises `errc::io_error` when the file cannot be written.
inline void publish_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec))
    fail(errc::invalid_argument,
         cat("comm::publish_file: ", path.string(),
             " already exists (a previous job's?); remove it or use a path unique to this job"));
  const std::filesystem::path temporary =
      path.string() + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out)
      fail(errc::io_error, cat("comm::publish_file: cannot create ", temporary.string(),
                               "; does the folder exist and is it writable?"));
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      out.close();
      std::filesystem::remove(temporary, ec);
      fail(errc::io_error, cat("comm::publish_file: cannot write ", bytes.size(), " bytes to ",
                               temporary.string()));
    }
  }
  std::filesystem::rename(temporary, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    fail(errc::io_error, cat("comm::publish_file: cannot rename ", temporary.string(), " to ",
                             path.string(), ": ", ec.message()));
  }
}

/// Waits until `path` exists, then reads exactly out.size() bytes from it into `out`.
/// Polls every millisecond at first, backing off to every 50 ms.
/// Raises `errc::timeout` after `timeout_seconds` without the file (naming the path and what
/// to check), `errc::corrupt_data` when the file's size is not out.size().
inline void await_file(const std::filesystem::path& path, std::span<std::byte> out,
                       double timeout_seconds) {
  STRATA_EXPECTS(timeout_seconds > 0, "comm::await_file: timeout must be positive, got ",
                 timeout_seconds);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                    std::chrono::duration<double>(timeout_seconds));
  auto pause = std::chrono::milliseconds(1);
  std::error_code ec;
  while (!std::filesystem::exists(path, ec)) {
    if (std::chrono::steady_clock::now() >= deadline)
      fail(errc::timeout,
           cat("comm::await_file: ", path.string(), " did not appear within ", timeout_seconds,
               " s; is the publishing rank running, and is the path on a filesystem every "
               "rank shares?"));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec || size != out.size())
    fail(errc::corrupt_data, cat("comm::await_file: ", path.string(), " holds ",
                                 ec ? std::string("an unreadable size") : cat(size, " bytes"),
                                 ", expected ", out.size()));
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(out.data()), static_cast<std::streamsize>(out.size()));
  if (!in || in.gcount() != static_cast<std::streamsize>(out.size()))
    fail(errc::io_error,
         cat("comm::await_file: cannot read ", out.size(), " bytes from ", path.string()));
}

}  // namespace strata::comm

/// @file memory.hpp
/// How much more memory this process may allocate: the least of what its address-space limit
/// (RLIMIT_AS), its data limit (RLIMIT_DATA) and the machine's memory leave, each less what the
/// process already uses of it.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

#include "strata/core/error.hpp"

namespace strata {

/// What this process uses now (from /proc/self/status; zeros where it cannot be read).
struct process_memory {
  std::uint64_t address_space = 0;  ///< VmSize: every mapping, reserved or touched (bytes)
  std::uint64_t data = 0;           ///< VmData: private writable mappings (bytes)
  std::uint64_t resident = 0;       ///< VmRSS: pages in memory (bytes)
};

/// Reads VmSize, VmData and VmRSS of /proc/self/status (Linux). Cost: one small file read.
inline process_memory current_process_memory() {
  process_memory m;
  std::ifstream in("/proc/self/status");
  std::string line;
  const auto kib = [&](std::string_view field, std::uint64_t& out) {
    if (line.rfind(field, 0) != 0) return;
    out = std::stoull(line.substr(field.size())) * 1024;  // "VmSize:\t  123456 kB"
  };
  while (std::getline(in, line)) {
    kib("VmSize:", m.address_space);
    kib("VmData:", m.data);
    kib("VmRSS:", m.resident);
  }
  return m;
}

/// The memory this process may still allocate, and the limit that says so.
struct memory_headroom {
  std::uint64_t bytes = 0;  ///< what may still be allocated: limit − used (0 if used ≥ limit)
  std::uint64_t limit = 0;  ///< the binding limit (bytes)
  std::uint64_t used = 0;   ///< what the process uses of that limit now (bytes)
  /// "RLIMIT_AS" (used: VmSize), "RLIMIT_DATA" (used: VmData) or "physical memory" (used: VmRSS).
  std::string source;

  /// e.g. "RLIMIT_AS 700 MiB - 512 MiB in use (VmSize) = 188 MiB".
  [[nodiscard]] std::string describe() const {
    const char* what = source == "RLIMIT_AS"     ? "VmSize"
                       : source == "RLIMIT_DATA" ? "VmData"
                                                 : "VmRSS";
    return cat(source, " ", limit >> 20, " MiB - ", used >> 20, " MiB in use (", what,
               ") = ", bytes >> 20, " MiB");
  }
};

/// The least headroom of: the soft RLIMIT_AS less VmSize (every mapping counts, reserved or
/// not: thread stacks, malloc arenas, MPI's shared segments), the soft RLIMIT_DATA less VmData
/// (Linux ≥ 4.7 counts private writable mappings), and the machine's physical memory less this
/// process's resident pages (other processes on the machine share it: with several table
/// holders on one host, their sum must fit). Unlimited limits are skipped. Not a promise: the
/// process's later thread stacks and arenas come out of it too. Cost: one /proc read, three
/// system calls.
inline memory_headroom current_memory_headroom() {
  const process_memory now = current_process_memory();
  memory_headroom best;
  const auto consider = [&](const char* source, std::uint64_t limit, std::uint64_t used) {
    const std::uint64_t left = limit > used ? limit - used : 0;
    if (best.source.empty() || left < best.bytes) best = {left, limit, used, source};
  };
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && page > 0)
    consider("physical memory",
             static_cast<std::uint64_t>(pages) * static_cast<std::uint64_t>(page), now.resident);
  rlimit r{};
  if (::getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    consider("RLIMIT_AS", r.rlim_cur, now.address_space);
  if (::getrlimit(RLIMIT_DATA, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    consider("RLIMIT_DATA", r.rlim_cur, now.data);
  return best;
}

}  // namespace strata

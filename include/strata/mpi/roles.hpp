/// @file roles.hpp
/// Which MPI ranks train and which serve embedding shards, from the command line:
/// `--servers S` makes the last S ranks dedicated parameter servers (`ps::layout::dedicated`);
/// without it (or with `--servers 0`) every rank trains and serves one shard (co-located).
///
/// ```cpp
/// // mpirun -np 5 ./ctr_train --servers 2   → ranks 0-2 train, ranks 3-4 serve
/// strata::ps::layout roles = strata::mpi::layout_from_args(argc, argv, t.size());
/// ```
#pragma once

#include <charconv>
#include <string_view>

#include "strata/core/error.hpp"
#include "strata/ps/layout.hpp"

namespace strata::mpi {

/// The layout of `world_size` ranks with `servers` dedicated servers (the last ranks), or
/// co-located when `servers == 0`. Raises `errc::invalid_argument` when no rank would train.
[[nodiscard]] inline ps::layout layout_for(int world_size, int servers) {
  STRATA_EXPECTS(world_size >= 1, "mpi::layout_for: world size must be >= 1, got ", world_size);
  STRATA_EXPECTS(servers >= 0 && servers < world_size, "mpi::layout_for: --servers ", servers,
                 " with ", world_size, " ranks leaves no worker; pass 0 <= servers < ", world_size,
                 " (0 = every rank trains and serves)");
  if (servers == 0) return ps::layout::colocated(world_size);
  return ps::layout::dedicated(world_size - servers, servers);
}

/// The value of `--servers S` (or `--servers=S`) in argv, or `fallback` when absent. A value
/// that is not a non-negative integer raises `errc::invalid_argument`.
[[nodiscard]] inline int servers_from_args(int argc, const char* const* argv, int fallback = 0) {
  int servers = fallback;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    std::string_view value;
    if (arg == "--servers") {
      STRATA_EXPECTS(i + 1 < argc, "--servers needs a number of server ranks");
      value = argv[++i];
    } else if (arg.starts_with("--servers=")) {
      value = arg.substr(10);
    } else {
      continue;
    }
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), servers);
    STRATA_EXPECTS(ec == std::errc{} && end == value.data() + value.size() && servers >= 0,
                   "--servers expects a non-negative integer, got '", value, "'");
  }
  return servers;
}

/// `layout_for(world_size, servers_from_args(argc, argv))`.
[[nodiscard]] inline ps::layout layout_from_args(int argc, const char* const* argv,
                                                 int world_size) {
  return layout_for(world_size, servers_from_args(argc, argv));
}

}  // namespace strata::mpi

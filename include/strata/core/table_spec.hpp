/// @file table_spec.hpp
/// `table_spec`: the shape of one embedding table — what embedding storages, parameter-server
/// shard maps and models agree on. Below both `embedding/` and `ps/`; `embedding::table_spec`
/// names the same type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace strata {

/// Shape of one embedding table. `rows == 0` means no fixed vocabulary (hash-table storage:
/// any 64-bit key, rows created on first touch).
struct table_spec {
  std::string name;
  std::uint64_t rows = 0;
  std::size_t dim = 0;
};

}  // namespace strata

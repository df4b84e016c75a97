/// @file partition.hpp
/// Which server holds a key: by hash (default) or by contiguous key range; and the shard map
/// that client and server share (layout + table specs + partitioning).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/table_spec.hpp"
#include "strata/ps/layout.hpp"

namespace strata::ps {

/// How keys are spread over servers.
enum class partition_kind {
  hash,   ///< server = mix(table, key) reduced to [0, S): spreads hot keys, any 64-bit key
  range,  ///< server s holds rows [s·rows/S, (s+1)·rows/S) of a fixed table (unbounded
          ///< tables, rows == 0, fall back to hash)
};

namespace detail {
__extension__ typedef unsigned __int128 uint128;  // NOLINT: GCC/Clang extension, silenced
}  // namespace detail

/// Server index of `key` of table `table` (with `rows` rows, 0 = unbounded) among `servers`.
/// Pure function; O(1).
[[nodiscard]] constexpr std::size_t server_of(partition_kind kind, std::size_t table,
                                              std::uint64_t rows, std::uint64_t key,
                                              std::size_t servers) noexcept {
  if (servers <= 1) return 0;
  if (kind == partition_kind::range && rows > 0 && key < rows)
    return static_cast<std::size_t>((static_cast<detail::uint128>(key) * servers) / rows);
  const std::uint64_t h = mix_ids(static_cast<std::uint64_t>(table) + 0x5053ull, key);
  return static_cast<std::size_t>((static_cast<detail::uint128>(h) * servers) >> 64);
}

/// What every client and server of one job must agree on: the roles of the ranks, the tables
/// and how keys map to servers. Value type; const members are thread-safe.
class shard_map {
 public:
  shard_map(ps::layout roles, std::vector<table_spec> tables,
            partition_kind kind = partition_kind::hash)
      : layout_(roles), tables_(std::move(tables)), kind_(kind) {
    STRATA_EXPECTS(!tables_.empty(), "ps::shard_map: needs at least one table");
    for (std::size_t t = 0; t < tables_.size(); ++t)
      STRATA_EXPECTS(tables_[t].dim > 0 && tables_[t].dim <= (1u << 20), "ps::shard_map: table ", t,
                     " '", tables_[t].name, "' has dim ", tables_[t].dim,
                     "; it must be in [1, 2^20]");
  }

  [[nodiscard]] const ps::layout& roles() const noexcept { return layout_; }
  [[nodiscard]] partition_kind partition() const noexcept { return kind_; }
  [[nodiscard]] std::size_t table_count() const noexcept { return tables_.size(); }
  [[nodiscard]] std::span<const table_spec> tables() const noexcept { return tables_; }
  [[nodiscard]] const table_spec& spec(std::size_t table) const {
    check_table(table, "ps::shard_map::spec");
    return tables_[table];
  }
  /// Server index (not rank) holding `key` of `table`. The key is not range-checked.
  [[nodiscard]] std::size_t server_of(std::size_t table, std::uint64_t key) const noexcept {
    return ps::server_of(kind_, table, tables_[table].rows, key,
                         static_cast<std::size_t>(layout_.servers()));
  }

  /// Raises `errc::out_of_range` for a table index outside [0, table_count()).
  void check_table(std::size_t table, const char* who) const {
    if (table >= tables_.size())
      fail(errc::out_of_range, cat(who, ": table ", table, " outside the ", tables_.size(),
                                   " tables of this parameter server"));
  }
  /// Raises `errc::out_of_range` naming table, key and range when a key is outside a fixed
  /// table.
  void check_keys(std::size_t table, std::span<const std::uint64_t> keys, const char* who) const {
    check_table(table, who);
    const auto& spec = tables_[table];
    if (spec.rows == 0) return;
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] >= spec.rows) [[unlikely]]
        fail(errc::out_of_range, cat(who, ": key ", keys[i], " (position ", i, ") of table ", table,
                                     " '", spec.name, "' is outside its rows [0, ", spec.rows,
                                     "); map raw ids into the vocabulary "
                                     "(or declare the table with rows = 0 for any 64-bit key)"));
  }

 private:
  ps::layout layout_;
  std::vector<table_spec> tables_;
  partition_kind kind_;
};

}  // namespace strata::ps

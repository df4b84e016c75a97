/// @file table_groups.hpp
/// `table_groups<First, Second>`: one storage, two sparse optimizers — the tables flagged in
/// `in_first` update with `First`, the others with `Second` (Wide & Deep's wide tables with
/// FTRL, its deep tables with Adagrad, as the paper trains them).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <string_view>
#include <utility>
#include <vector>

#include "strata/optim/concepts.hpp"

namespace strata::optim {

namespace detail {
/// "table_groups<first,second>" as a constant string (checkpoints record optimizer names).
template <class First, class Second>
struct table_groups_name {
  static constexpr std::string_view prefix = "table_groups<";
  static constexpr std::size_t size = prefix.size() + std::string_view(First::name).size() + 1 +
                                      std::string_view(Second::name).size() + 2;
  static constexpr std::array<char, size> text = [] {
    std::array<char, size> out{};
    std::size_t at = 0;
    for (const char c : prefix)
      out[at++] = c;
    for (const char c : std::string_view(First::name))
      out[at++] = c;
    out[at++] = ',';
    for (const char c : std::string_view(Second::name))
      out[at++] = c;
    out[at++] = '>';
    out[at] = '\0';
    return out;
  }();
};
}  // namespace detail

/// Two sparse optimizers over the tables of one storage. `in_first[t]` (tables beyond its size
/// count as not flagged) picks `first` for table t, else `second`. Every row keeps
/// `state_floats(dim)` = the larger of the two optimizers' state; each uses the first floats of
/// it. Models `per_table_optimizer` (storages call `visit` through `optim::with_table`); not a
/// dense optimizer (the dense parameters are no table). Value type; thread-safe.
template <sparse_optimizer First, sparse_optimizer Second>
struct table_groups {
  using per_table_tag = void;
  static constexpr const char* name = detail::table_groups_name<First, Second>::text.data();

  First first{};
  Second second{};
  std::vector<bool> in_first{};

  [[nodiscard]] static constexpr std::size_t state_floats(std::size_t dim) noexcept {
    return std::max<std::size_t>(First::state_floats(dim), Second::state_floats(dim));
  }
  [[nodiscard]] bool uses_first(std::size_t table) const noexcept {
    return table < in_first.size() && in_first[table];
  }
  /// fn(the optimizer of `table`).
  template <class Fn>
  decltype(auto) visit(std::size_t table, Fn&& fn) const {
    if (uses_first(table)) return std::forward<Fn>(fn)(first);
    return std::forward<Fn>(fn)(second);
  }
};

}  // namespace strata::optim

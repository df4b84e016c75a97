/// @file consistency.hpp
/// Consistency policies of parameter-server updates: `sync`, `async`, `bounded<S>`.
#pragma once

#include <concepts>
#include <cstdint>
#include <limits>

#include "strata/core/error.hpp"

namespace strata::ps {

/// A consistency policy: static facts the server and the trainer act on.
///
/// - `name`: short name for logs.
/// - `code`: wire code sent in every request; a server rejects a worker using another policy.
/// - `aggregates_step`: pushes of one step from all workers are summed (worker-rank order) and
///   applied once (true only for `sync`); otherwise each push is applied on arrival.
/// - `blocks_on_step`: a pull may wait for other workers' progress.
/// - `max_staleness`: the most steps a worker's pull may be ahead of the slowest worker's
///   applied pushes (`no_bound` for `async`).
template <class C>
concept consistency = requires {
  { C::name } -> std::convertible_to<const char*>;
  { C::code } -> std::convertible_to<std::uint32_t>;
  { C::aggregates_step } -> std::convertible_to<bool>;
  { C::blocks_on_step } -> std::convertible_to<bool>;
  { C::max_staleness } -> std::convertible_to<std::uint64_t>;
};

/// `max_staleness` of a policy without a bound.
inline constexpr std::uint64_t no_bound = std::numeric_limits<std::uint64_t>::max();

/// A blocking bound must stay below this many steps: the wire code keeps it in 24 bits.
inline constexpr std::uint64_t staleness_limit = std::uint64_t{1} << 24;

/// The wire code of `bounded<S>` (S < staleness_limit).
constexpr std::uint32_t bounded_code(std::uint64_t staleness) {
  return 3u | static_cast<std::uint32_t>(staleness << 8);
}

/// Bulk synchronous: a step's pushes from all W workers for a table are summed in worker-rank
/// order, then applied once; a pull for step t waits until steps < t are applied. Equals
/// single-process training on the global batch (bitwise when the reference sums in the same
/// order). Cost: every step runs at the pace of the slowest worker.
struct sync {
  static constexpr const char* name = "sync";
  static constexpr std::uint32_t code = 1;
  static constexpr bool aggregates_step = true;
  static constexpr bool blocks_on_step = true;
  static constexpr std::uint64_t max_staleness = 0;
};

/// Asynchronous: each push is applied on arrival; pulls never wait, so a straggler never slows
/// the others (at the price of stale gradients, unbounded in steps).
struct async {
  static constexpr const char* name = "async";
  static constexpr std::uint32_t code = 2;
  static constexpr bool aggregates_step = false;
  static constexpr bool blocks_on_step = false;
  static constexpr std::uint64_t max_staleness = no_bound;
};

/// Bounded staleness (stale synchronous parallel): pushes are applied on arrival, and a pull
/// for step t waits only while the slowest worker has applied fewer than t − S steps.
template <std::uint64_t S>
struct bounded {
  static_assert(S < staleness_limit, "ps::bounded<S>: S must be below 2^24 steps");
  static constexpr const char* name = "bounded";
  static constexpr std::uint32_t code = bounded_code(S);
  static constexpr bool aggregates_step = false;
  static constexpr bool blocks_on_step = true;
  static constexpr std::uint64_t max_staleness = S;
};

static_assert(consistency<sync> && consistency<async> && consistency<bounded<2>>);

/// A consistency policy's facts as run-time values: what `ps::server_core` acts on, so one
/// server type (and one copy of its code) serves every policy.
struct consistency_rule {
  const char* name = sync::name;
  std::uint32_t code = sync::code;
  bool aggregates_step = sync::aggregates_step;
  bool blocks_on_step = sync::blocks_on_step;
  std::uint64_t max_staleness = sync::max_staleness;
};

/// Refuses a rule no policy has: a summing policy that does not block, a blocking bound of
/// 2^24 steps or more (`bounded<S>`'s limit), or no name. `who` names the caller.
inline void check_rule(const consistency_rule& rule, const char* who) {
  const auto refuse = [&](const char* why) {
    throw error(
        errc::invalid_argument,
        cat(who, ": consistency rule '", rule.name ? rule.name : "(no name)", "' (code ", rule.code,
            ") ", why, "; use ps::rule_of<ps::sync / ps::async / ps::bounded<S>>"));
  };
  if (rule.name == nullptr) refuse("has no name");
  if (rule.aggregates_step && !rule.blocks_on_step)
    refuse("sums each step's pushes but does not block pulls on the step");
  if (rule.blocks_on_step && !rule.aggregates_step && rule.max_staleness >= staleness_limit)
    refuse("blocks pulls with a staleness bound of 2^24 steps or more");
}

/// The rule of `bounded<S>` for a bound S chosen at run time: equal to `rule_of<bounded<S>>`.
/// S ≥ 2^24 is refused with errc::invalid_argument.
inline consistency_rule bounded_rule(std::uint64_t staleness) {
  if (staleness >= staleness_limit)
    throw error(errc::invalid_argument,
                cat("ps::bounded_rule: staleness bound ", staleness,
                    " steps is too large; use a bound below 2^24 = ", staleness_limit, " steps"));
  return {"bounded", bounded_code(staleness), false, true, staleness};
}

/// The run-time facts of policy `C`.
template <consistency C>
inline constexpr consistency_rule rule_of{C::name, C::code, C::aggregates_step, C::blocks_on_step,
                                          C::max_staleness};

/// The consistency policy chosen at run time: names no policy, so one trainer, storage, client
/// and server type serves sync, async and every bounded<S>; the `consistency_rule` comes as a
/// value (e.g. `train::parameter_server<ps::run_time_rule>{.rule = ps::rule_of<ps::async>}`).
/// A program that offers several policies compiles its trainer once instead of once per policy.
struct run_time_rule {};

/// A policy as a type (`consistency`) or `run_time_rule`.
template <class C>
concept consistency_choice = consistency<C> || std::same_as<C, run_time_rule>;

/// `rule`, checked (`check_rule`) and, when `C` is a policy type, refused unless it is that
/// policy's own rule: the rule a server or client of consistency choice `C` runs.
template <consistency_choice C>
consistency_rule rule_for(const consistency_rule& rule, const char* who) {
  check_rule(rule, who);
  if constexpr (consistency<C>) {
    if (rule.code != C::code || rule.aggregates_step != C::aggregates_step ||
        rule.blocks_on_step != C::blocks_on_step || rule.max_staleness != C::max_staleness)
      throw error(errc::invalid_argument,
                  cat(who, ": consistency rule '", rule.name, "' (code ", rule.code,
                      ") given to a ", C::name, " (code ", C::code,
                      ") type; name ps::run_time_rule as the type to choose the rule at run time"));
  }
  return rule;
}

}  // namespace strata::ps

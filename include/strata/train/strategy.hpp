/// @file strategy.hpp
/// Communicator policies of the trainer — how a model's two parts travel — and the
/// compile-time choice among them from the model's sizes.
///
/// | communicator                          | embeddings                   | dense parameters |
/// |---------------------------------------|------------------------------|-------------------------|
/// | `comm::ring_allreduce`                | local replica on each worker; row gradients exchanged
/// among workers | ring allreduce | | `parameter_server<Consistency>`       | sharded on PS servers
/// | on the PS servers too   | | `hybrid<Consistency, Allreduce>`      | sharded on PS servers |
/// ring allreduce          |
#pragma once

#include <cstdint>
#include <type_traits>

#include "strata/comm/collectives.hpp"
#include "strata/ps/consistency.hpp"

namespace strata::train {

/// Embeddings and dense parameters on parameter servers (the classic PS for CTR models).
template <class Consistency = ps::sync>
struct parameter_server {
  using consistency = Consistency;
  static constexpr bool embeddings_on_ps = true;
  static constexpr bool dense_on_ps = true;
  static constexpr const char* name = "parameter_server";
};

/// Embeddings on parameter servers, dense parameters by allreduce among workers. The value
/// carries the Allreduce's options, e.g. `hybrid<ps::sync>{.dense_allreduce = {.chunk_bytes =
/// 256 << 10}}` (pass it as the trainer's last constructor argument).
template <class Consistency = ps::sync, class Allreduce = comm::ring_allreduce>
struct hybrid {
  using consistency = Consistency;
  using allreduce = Allreduce;
  Allreduce dense_allreduce{};  ///< sums the dense gradients among the workers
  static constexpr bool embeddings_on_ps = true;
  static constexpr bool dense_on_ps = false;
  static constexpr const char* name = "hybrid";
};

/// `parameter_server` with the consistency chosen at run time: the value carries the rule, e.g.
/// `parameter_server<ps::run_time_rule>{.rule = ps::rule_of<ps::bounded<4>>}` (the Storage is
/// then `embedding::sharded<Opt, ps::run_time_rule>`).
template <>
struct parameter_server<ps::run_time_rule> {
  using consistency = ps::run_time_rule;
  ps::consistency_rule rule = ps::rule_of<ps::sync>;  ///< the servers' and the workers' policy
  static constexpr bool embeddings_on_ps = true;
  static constexpr bool dense_on_ps = true;
  static constexpr const char* name = "parameter_server";
};

/// `hybrid` with the consistency chosen at run time: `hybrid<ps::run_time_rule>{.rule =
/// ps::rule_of<ps::async>, .dense_allreduce = …}`.
template <class Allreduce>
struct hybrid<ps::run_time_rule, Allreduce> {
  using consistency = ps::run_time_rule;
  using allreduce = Allreduce;
  ps::consistency_rule rule = ps::rule_of<ps::sync>;  ///< the servers' and the workers' policy
  Allreduce dense_allreduce{};                        ///< sums the dense gradients
  static constexpr bool embeddings_on_ps = true;
  static constexpr bool dense_on_ps = false;
  static constexpr const char* name = "hybrid";
};

/// Facts about a communicator policy; specialised for each.
template <class C>
struct communicator_traits {
  static constexpr bool known = false;
};
template <>
struct communicator_traits<comm::ring_allreduce> {
  static constexpr bool known = true;
  static constexpr bool embeddings_on_ps = false;
  static constexpr bool dense_on_ps = false;
  static constexpr bool uses_ps = false;
  static constexpr const char* name = "allreduce";
  using consistency = ps::sync;            // allreduce training is always bulk-synchronous
  using allreduce = comm::ring_allreduce;  ///< sums the dense gradients
  /// The allreduce that sums the dense gradients, with the communicator's options.
  static allreduce dense_allreduce(const comm::ring_allreduce& c) { return c; }
};
template <class Consistency>
struct communicator_traits<parameter_server<Consistency>> {
  static constexpr bool known = true;
  static constexpr bool embeddings_on_ps = true;
  static constexpr bool dense_on_ps = true;
  static constexpr bool uses_ps = true;
  static constexpr const char* name = "ps";
  using consistency = Consistency;
  using allreduce = comm::ring_allreduce;  ///< unused: the servers sum the dense gradients
  static allreduce dense_allreduce(const parameter_server<Consistency>&) { return {}; }
};
template <class Consistency, class Allreduce>
struct communicator_traits<hybrid<Consistency, Allreduce>> {
  static constexpr bool known = true;
  static constexpr bool embeddings_on_ps = true;
  static constexpr bool dense_on_ps = false;
  static constexpr bool uses_ps = true;
  static constexpr const char* name = "hybrid";
  using consistency = Consistency;
  /// Sums the dense gradients among the workers: strata's ring, or another policy such as
  /// mpi::native_allreduce (the MPI library's MPI_Allreduce on a workers-only communicator).
  using allreduce = Allreduce;
  static allreduce dense_allreduce(const hybrid<Consistency, Allreduce>& c) {
    return c.dense_allreduce;
  }
};

/// A type the trainer accepts as its Communicator.
template <class C>
concept communicator = communicator_traits<C>::known;

/// The consistency rule communicator `c` trains under: its policy type's, or the rule it
/// carries (`ps::run_time_rule`); `ps::sync` for ring allreduce.
template <communicator C>
ps::consistency_rule consistency_rule_of(const C& c) {
  using consistency = typename communicator_traits<C>::consistency;
  if constexpr (std::is_same_v<consistency, ps::run_time_rule>)
    return c.rule;
  else
    return ps::rule_of<consistency>;
}

/// Thresholds of auto_strategy: embeddings "dominate" at ≥ 70% of parameter bytes; a DNN is
/// "small" up to 64 MiB of parameters; embeddings are "small" below 30%.
inline constexpr double ps_embedding_share = 0.70;
inline constexpr double allreduce_embedding_share = 0.30;
inline constexpr std::uint64_t small_dnn_bytes = std::uint64_t{64} << 20;

/// The three strategies the size rule chooses among.
enum class strategy_kind { allreduce, parameter_server, hybrid };

/// Embeddings' share of the parameter bytes (0 for a model without parameters).
constexpr double embedding_share(std::uint64_t embedding_bytes, std::uint64_t dense_bytes) {
  return embedding_bytes + dense_bytes == 0
             ? 0.0
             : static_cast<double>(embedding_bytes) /
                   static_cast<double>(embedding_bytes + dense_bytes);
}

/// The size rule, one function for compile time (auto_strategy, auto_trainer) and run time
/// (`ctr_train --strategy auto`): parameter server when embeddings are ≥ 70% of the parameter
/// bytes and the DNN is small (≤ 64 MiB), ring allreduce when embeddings are small (< 30%),
/// hybrid otherwise. The DNN cap departs from the bare "≥ 70% → PS" rule on purpose: under a
/// parameter server every worker pulls and pushes the whole DNN through the servers each step
/// (N·D bytes into and out of the servers), while a ring moves 2(N−1)/N·D per worker with no
/// hot spot — so a large DNN goes to allreduce beside PS-held tables (hybrid), see docs/ctr.md.
constexpr strategy_kind choose_strategy_kind(std::uint64_t embedding_bytes,
                                             std::uint64_t dense_bytes) {
  const double share = embedding_share(embedding_bytes, dense_bytes);
  if (share >= ps_embedding_share && dense_bytes <= small_dnn_bytes)
    return strategy_kind::parameter_server;
  if (share < allreduce_embedding_share) return strategy_kind::allreduce;
  return strategy_kind::hybrid;
}

/// The size rule's answer as ctr_train's --strategy name: "ps", "allreduce" or "hybrid".
constexpr const char* choose_strategy(std::uint64_t embedding_bytes, std::uint64_t dense_bytes) {
  switch (choose_strategy_kind(embedding_bytes, dense_bytes)) {
    case strategy_kind::parameter_server:
      return "ps";
    case strategy_kind::allreduce:
      return "allreduce";
    case strategy_kind::hybrid:
      break;
  }
  return "hybrid";
}

/// Compile-time strategy from the model's sizes (choose_strategy_kind's rule):
/// `parameter_server<Consistency>`, `comm::ring_allreduce` or `hybrid<Consistency>`.
template <std::uint64_t embedding_bytes, std::uint64_t dense_bytes, class Consistency = ps::sync>
struct auto_strategy {
  static constexpr strategy_kind kind = choose_strategy_kind(embedding_bytes, dense_bytes);
  static constexpr double embedding_share = train::embedding_share(embedding_bytes, dense_bytes);
  using type =
      std::conditional_t<kind == strategy_kind::parameter_server, parameter_server<Consistency>,
                         std::conditional_t<kind == strategy_kind::allreduce, comm::ring_allreduce,
                                            hybrid<Consistency>>>;
};
template <std::uint64_t embedding_bytes, std::uint64_t dense_bytes, class Consistency = ps::sync>
using auto_strategy_t = typename auto_strategy<embedding_bytes, dense_bytes, Consistency>::type;

}  // namespace strata::train

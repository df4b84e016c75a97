/// @file phase.hpp
/// The phase of training a message belongs to (pull, push, allreduce, checkpoint, …), named
/// from its tag — and, for protocols that share one tag (a parameter server's pulls and pushes
/// both travel as `tags::ps_request`), refined from its bytes by a `phase_classifier` the
/// layer that owns the protocol supplies (`ps::message_phase`). Timeouts, checksum failures
/// and injected faults name the phase, and a fault plan selects messages by it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "strata/comm/concepts.hpp"
#include "strata/core/error.hpp"

namespace strata::comm {

/// What a message is for. `any` matches every phase in a fault plan.
enum class phase : std::uint8_t {
  any,
  pull,        ///< PS pull request or its reply
  push,        ///< PS push request (row / dense gradients)
  request,     ///< a PS request as its server waits for it: a pull or a push
  allreduce,   ///< dense gradients summed over the workers (ring, rank-ordered, compressed)
  allgather,   ///< all-gathers (row gradients under allreduce)
  checkpoint,  ///< the barriers of writing or resuming a checkpoint
  barrier,     ///< other barriers (between segments)
  broadcast,
  shutdown,  ///< a worker's end-of-segment message to its servers and their answer
  report,    ///< end-of-run checksums gathered on rank 0
  user,      ///< tags below reserved_tag_base
};

inline constexpr std::array<std::string_view, 12> phase_names = {
    "any",        "pull",    "push",      "pull or push", "allreduce", "allgather",
    "checkpoint", "barrier", "broadcast", "shutdown",     "report",    "user"};

/// The phase's name as errors and docs show it.
[[nodiscard]] constexpr std::string_view phase_name(phase p) noexcept {
  return phase_names[static_cast<std::size_t>(p)];
}

/// The phase of a name ("pull", "push", "allreduce", "checkpoint", …, "any"); refuses others
/// with the list of accepted names.
[[nodiscard]] inline phase parse_phase(std::string_view name) {
  for (std::size_t i = 0; i < phase_names.size(); ++i)
    if (phase_names[i] == name && name != "pull or push") return static_cast<phase>(i);
  fail(errc::invalid_argument,
       cat("unknown phase '", name,
           "'; expected one of any, pull, push, allreduce, allgather, checkpoint, barrier, "
           "broadcast, shutdown, report, user"));
}

/// The phase of a tag alone (what a receiver knows while it waits): a PS request is `request`
/// (pull or push), a PS reply `pull` (replies answer pulls; a shutdown's answer shares the tag).
[[nodiscard]] constexpr phase phase_of_tag(tag_t tag) noexcept {
  switch (tag) {
    case tags::allreduce:
    case tags::allreduce_check:
    case tags::compressed_allreduce:
    case tags::ordered_allreduce:
      return phase::allreduce;
    case tags::allgather:
    case tags::gatherv:
      return phase::allgather;
    case tags::broadcast:
      return phase::broadcast;
    case tags::barrier:
      return phase::barrier;
    case tags::checkpoint:
      return phase::checkpoint;
    case tags::ps_request:
      return phase::request;
    case tags::ps_reply:
      return phase::pull;
    case tags::report:
      return phase::report;
    default:
      return tag < reserved_tag_base ? phase::user : phase::any;
  }
}

/// Names the phase of a message from its tag and bytes (nullptr: the tag alone).
using phase_classifier = phase (*)(tag_t, std::span<const std::byte>) noexcept;

/// `phase_of_tag`, or `classify(tag, bytes)` when given.
[[nodiscard]] inline phase phase_of(phase_classifier classify, tag_t tag,
                                    std::span<const std::byte> bytes) noexcept {
  return classify != nullptr ? classify(tag, bytes) : phase_of_tag(tag);
}

/// "phase 'pull' (tag 2147483904)": how errors name where a message belonged.
[[nodiscard]] inline std::string describe_phase(phase p, tag_t tag) {
  return cat("phase '", phase_name(p), "' (tag ", tag, ")");
}

}  // namespace strata::comm

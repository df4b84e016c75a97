/// @file launch.hpp
/// Starting a trainer's ranks: the options of the in-process world (emulated links,
/// stragglers, injected faults) and a co-located server rank's second thread.
#pragma once

#include <exception>
#include <thread>
#include <utility>

#include "strata/comm/thread_world.hpp"
#include "strata/core/error.hpp"
#include "strata/ps/protocol.hpp"
#include "strata/train/options.hpp"

namespace strata::train {

/// The `thread_world` options of a run with `ranks` ranks: timeout, emulated link, per-rank
/// send delays (stragglers), the injected fault (`fail_rank` fails on its `fail_on_send`-th
/// send), the fault plan (checked here: a bad plan raises errc::invalid_argument) and
/// checksums; phases are named by `ps::message_phase` (pulls told from pushes).
inline comm::world_options world_options_for(const trainer_options& options, int ranks) {
  comm::world_options wo;
  wo.timeout_seconds = options.timeout_seconds;
  wo.link = options.link;
  wo.send_delay_seconds = options.send_delay_seconds;
  comm::check_fault_plan(options.faults, ranks);
  wo.faults = options.faults;
  wo.checksums = options.message_checksums;
  wo.classify = &ps::message_phase;
  if (options.fail_rank >= 0 && options.fail_on_send > 0) {
    STRATA_EXPECTS(options.fail_rank < ranks, "trainer: fail_rank ", options.fail_rank,
                   " outside the ", ranks, " ranks");
    wo.fail_on_send.assign(static_cast<std::size_t>(ranks), 0);
    wo.fail_on_send[static_cast<std::size_t>(options.fail_rank)] = options.fail_on_send;
  }
  return wo;
}

/// Runs `serve` on a second thread while `work` runs on this one (a rank that is a server and
/// a worker). `work`'s failure is rethrown once `serve` has ended (the world is stopping, so
/// the server's blocking receive ends with errc::aborted); otherwise `serve`'s failure is.
template <class Serve, class Work>
void run_beside(Serve&& serve, Work&& work) {
  std::exception_ptr server_failure;
  std::thread serving([&] {
    try {
      serve();
    } catch (...) {
      server_failure = std::current_exception();
    }
  });
  std::exception_ptr worker_failure;
  try {
    work();
  } catch (...) {
    worker_failure = std::current_exception();
  }
  serving.join();
  if (worker_failure) std::rethrow_exception(worker_failure);
  if (server_failure) std::rethrow_exception(server_failure);
}

}  // namespace strata::train

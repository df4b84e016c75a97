/// @file run_traces.hpp
/// One run's timeline traces (trainer_options::trace_file): a `trace_recorder` per rank of the
/// process, the file each rank writes — the named file for a threaded run (every rank a track),
/// `<stem>.rank<R><extension>` beside it for one process of a multi-process world — checked
/// writable before training, and spans of whatever a rank does around its steps.
#pragma once

#include <cstddef>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/trace.hpp"

namespace strata::train {

/// The traces of one run's ranks in this process; off (every call a no-op, `at` null) when
/// `file` is empty. Each rank's recorder is filled by the thread that runs the rank.
class run_traces {
 public:
  run_traces(std::filesystem::path file, int ranks)
      : file_(std::move(file)), recorders_(static_cast<std::size_t>(ranks)) {}

  [[nodiscard]] bool on() const noexcept { return !file_.empty(); }

  /// The file of rank `rank` of a multi-process world, or of the whole threaded run
  /// (`rank` < 0).
  [[nodiscard]] std::filesystem::path path(int rank) const {
    if (rank < 0) return file_;
    return file_.parent_path() /
           cat(file_.stem().string(), ".rank", rank, file_.extension().string());
  }
  /// Refuses (errc::io_error) a trace file that cannot be written, before training.
  void check_writable(int rank) const {
    if (!on()) return;
    const auto file = path(rank);
    if (!std::ofstream(file, std::ios::app))
      fail(errc::io_error, cat("trainer: cannot write the trace file ", file.string(),
                               "; does its directory exist and is it writable?"));
  }
  /// Starts rank `rank`'s track, named `label` in the viewer; returns its recorder (null when
  /// off).
  trace_recorder* start(int rank, std::string label) {
    if (!on()) return nullptr;
    auto& slot = recorders_.at(static_cast<std::size_t>(rank));
    slot = std::make_unique<trace_recorder>(rank, std::move(label));
    return slot.get();
  }
  /// Rank `rank`'s recorder (null when off or not started).
  [[nodiscard]] trace_recorder* at(int rank) const {
    return recorders_.at(static_cast<std::size_t>(rank)).get();
  }
  /// Runs `fn`, recorded as a span `name` on rank `rank`'s track when tracing.
  template <class Fn>
  void span(int rank, const char* name, Fn&& fn) const {
    trace_recorder* trace = at(rank);
    const auto begin = trace_recorder::clock::now();
    std::forward<Fn>(fn)();
    if (trace != nullptr) trace->span(name, begin, trace_recorder::clock::now());
  }
  /// Writes every rank's track into the run's file (a threaded run).
  void write_all() const {
    if (!on()) return;
    std::vector<const trace_recorder*> tracks;
    for (const auto& r : recorders_)
      tracks.push_back(r.get());
    write_trace(path(-1), tracks);
  }
  /// Writes rank `rank`'s track into its own file (one process of a multi-process world).
  void write_rank(int rank) const {
    if (!on()) return;
    const trace_recorder* mine = at(rank);
    write_trace(path(rank), std::span(&mine, 1), rank);
  }

 private:
  std::filesystem::path file_;
  std::vector<std::unique_ptr<trace_recorder>> recorders_;
};

}  // namespace strata::train

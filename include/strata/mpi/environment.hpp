/// @file environment.hpp
/// `strata::mpi::environment`: RAII MPI_Init_thread / MPI_Finalize, requesting
/// MPI_THREAD_MULTIPLE and refusing clearly when the MPI library provides less than required.
///
/// ```cpp
/// int main(int argc, char** argv) {
///   strata::mpi::environment env(argc, argv);   // MPI_THREAD_MULTIPLE or an error
///   strata::mpi::transport t;                   // MPI_COMM_WORLD, duplicated
///   ...
/// }                                             // MPI_Finalize
/// ```
#pragma once

#include <mpi.h>

#include <string>
#include <string_view>

#include "strata/core/error.hpp"

namespace strata::mpi {

/// MPI thread support levels, in increasing order (MPI_THREAD_SINGLE … MPI_THREAD_MULTIPLE).
enum class threading { single, funneled, serialized, multiple };

/// Name of a thread level ("MPI_THREAD_MULTIPLE", …).
constexpr std::string_view to_string(threading level) noexcept {
  switch (level) {
    case threading::single:
      return "MPI_THREAD_SINGLE";
    case threading::funneled:
      return "MPI_THREAD_FUNNELED";
    case threading::serialized:
      return "MPI_THREAD_SERIALIZED";
    case threading::multiple:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown";
}

namespace detail {
inline int to_mpi(threading level) noexcept {
  switch (level) {
    case threading::single:
      return MPI_THREAD_SINGLE;
    case threading::funneled:
      return MPI_THREAD_FUNNELED;
    case threading::serialized:
      return MPI_THREAD_SERIALIZED;
    case threading::multiple:
      return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_MULTIPLE;
}
inline threading from_mpi(int level) noexcept {
  if (level >= MPI_THREAD_MULTIPLE) return threading::multiple;
  if (level >= MPI_THREAD_SERIALIZED) return threading::serialized;
  if (level >= MPI_THREAD_FUNNELED) return threading::funneled;
  return threading::single;
}
}  // namespace detail

/// Owns MPI's lifetime in this process: the constructor calls MPI_Init_thread asking for
/// MPI_THREAD_MULTIPLE (strata's transport is used from several threads: a parameter-server
/// shard answers on oneTBB threads beside its receive loop), the destructor MPI_Finalize.
///
/// If the library provides less than `required`, MPI is finalized again and
/// `errc::unsupported` is raised with a sentence saying what to do. If MPI was already
/// initialised by someone else, the environment only checks the level and leaves
/// MPI_Finalize to its owner. One per process; not copyable; construct and destroy it on the
/// main thread. MPI_Finalize waits for every rank of the job (Open MPI: a fence), so destroy
/// the environment only after the transports using it are gone.
class environment {
 public:
  /// Initialises MPI with the program's arguments (MPI may remove its own flags from them).
  environment(int& argc, char**& argv, threading required = threading::multiple) {
    init(&argc, &argv, required);
  }
  /// Initialises MPI without arguments.
  explicit environment(threading required = threading::multiple) {
    init(nullptr, nullptr, required);
  }
  environment(const environment&) = delete;
  environment& operator=(const environment&) = delete;
  ~environment() {
    if (!owns_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }

  /// The thread level MPI provides.
  [[nodiscard]] threading provided() const noexcept { return provided_; }
  /// Whether this object called MPI_Init_thread (and will call MPI_Finalize).
  [[nodiscard]] bool owns() const noexcept { return owns_; }

  /// Rank of this process in MPI_COMM_WORLD.
  [[nodiscard]] static int world_rank() {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    return rank;
  }
  /// Number of processes in MPI_COMM_WORLD.
  [[nodiscard]] static int world_size() {
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    return size;
  }
  /// The MPI library's version string (e.g. "Open MPI v4.1.4, …").
  [[nodiscard]] static std::string library_version() {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(text, &length);
    return std::string(text, static_cast<std::size_t>(length));
  }

 private:
  void init(int* argc, char*** argv, threading required) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      MPI_Query_thread(&provided);
    } else {
      const int rc = MPI_Init_thread(argc, argv, detail::to_mpi(threading::multiple), &provided);
      if (rc != MPI_SUCCESS)
        fail(errc::unsupported, cat("mpi::environment: MPI_Init_thread failed with code ", rc,
                                    "; was the program started with mpiexec/mpirun?"));
      owns_ = true;
    }
    provided_ = detail::from_mpi(provided);
    if (provided_ < required) {
      if (owns_) {
        MPI_Finalize();
        owns_ = false;
      }
      fail(errc::unsupported,
           cat("mpi::environment: the MPI library provides ", to_string(provided_), " but ",
               to_string(required),
               " is required; strata's MPI transport is called from several threads "
               "(parameter-server shards reply from worker threads). Use an MPI built with "
               "thread support (Open MPI: --enable-mpi-thread-multiple), or require a lower "
               "level and use each transport from one thread only."));
    }
  }

  threading provided_ = threading::single;
  bool owns_ = false;
};

}  // namespace strata::mpi

/// @file native_allreduce.hpp
/// `strata::mpi::native_allreduce`: the allreduce policy that hands the reduction to the MPI
/// library (MPI_Allreduce on the transport's communicator), selectable beside
/// `strata::comm::ring_allreduce` — both are called as `algorithm(t, std::span<V> data, op)`.
///
/// ```cpp
/// template <class Allreduce>  // comm::ring_allreduce or mpi::native_allreduce
/// void average(strata::mpi::transport& t, std::span<float> grad) {
///   Allreduce{}(t, grad, strata::comm::reduce_op::mean);
/// }
/// ```
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "strata/comm/collectives.hpp"
#include "strata/core/error.hpp"
#include "strata/mpi/transport.hpp"

namespace strata::mpi {

namespace detail {
template <class V>
MPI_Datatype datatype() noexcept {
  if constexpr (std::is_same_v<V, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<V, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<V, std::int32_t>)
    return MPI_INT32_T;
  else
    return MPI_INT64_T;
}
}  // namespace detail

/// Allreduce by the MPI library: `native_allreduce{}(t, data, op)` sums `data` over all ranks
/// of `t` in place (MPI_SUM with MPI_IN_PLACE on `t.communicator()`); `reduce_op::mean` sums,
/// then divides by the rank count (integers: truncating division, as in `ring_allreduce`).
///
/// First a 16-byte MPI_Iallreduce, polled with the transport's timeout, checks that every rank
/// arrived and passed the same length (else every rank raises `errc::size_mismatch`; a rank
/// that never arrives gives `errc::timeout`). Then the data moves in pieces of at most
/// `max_elements_per_call` (MPI counts are `int`) with the library's blocking MPI_Allreduce —
/// its fastest path; a rank dying inside that call is left to the launcher, which stops the
/// job. With `poll = true` each piece is an MPI_Iallreduce polled with the timeout instead
/// (never a hang, but Open MPI 4's non-blocking collectives run about half as fast).
/// The library picks the algorithm, so the transport's per-link byte counters do not move and
/// the summation order — hence the last bits of float results — may differ from the ring's.
/// Blocking; collective: every rank calls it in the same order, from one thread per transport
/// at a time.
struct native_allreduce {
  static constexpr const char* name = "native_allreduce";
  std::size_t max_elements_per_call = std::size_t{1} << 30;
  bool poll = false;  ///< MPI_Iallreduce polled with the transport's timeout for the data too

  /// An endpoint over the ranks of `t` that pass `member = true`, in `t`'s rank order (e.g.
  /// the workers of a job whose other ranks are parameter servers, so that the library's
  /// allreduce runs among the workers only); nullptr on the others. Collective over `t`
  /// (MPI_Comm_split): every rank calls it, in the same order as its other collectives.
  [[nodiscard]] static std::unique_ptr<transport> subset(transport& t, bool member) {
    MPI_Comm part = MPI_COMM_NULL;
    mpi::detail::check(
        MPI_Comm_split(t.communicator(), member ? 0 : MPI_UNDEFINED, t.rank(), &part),
        "MPI_Comm_split");
    if (part == MPI_COMM_NULL) return nullptr;
    transport_options options;
    options.timeout_seconds = t.timeout_seconds();
    std::unique_ptr<transport> endpoint;
    try {
      endpoint = std::make_unique<transport>(part, options);  // duplicates `part`
    } catch (...) {
      MPI_Comm_free(&part);
      throw;
    }
    MPI_Comm_free(&part);
    return endpoint;
  }

  template <comm::reducible V>
  void operator()(transport& t, std::span<V> data,
                  comm::reduce_op op = comm::reduce_op::sum) const {
    STRATA_EXPECTS(
        max_elements_per_call >= 1 && max_elements_per_call <= static_cast<std::size_t>(INT_MAX),
        "native_allreduce: max_elements_per_call must be in [1, 2^31-1], got ",
        max_elements_per_call);
    check_same_count(t, data.size());
    if (t.size() == 1) return;
    for (std::size_t offset = 0; offset < data.size(); offset += max_elements_per_call) {
      const std::size_t n = std::min(max_elements_per_call, data.size() - offset);
      V* piece = data.data() + offset;
      if (!poll) {
        mpi::detail::check(MPI_Allreduce(MPI_IN_PLACE, piece, static_cast<int>(n),
                                         detail::datatype<V>(), MPI_SUM, t.communicator()),
                           "MPI_Allreduce");
        continue;
      }
      MPI_Request request = MPI_REQUEST_NULL;
      mpi::detail::check(MPI_Iallreduce(MPI_IN_PLACE, piece, static_cast<int>(n),
                                        detail::datatype<V>(), MPI_SUM, t.communicator(), &request),
                         "MPI_Iallreduce");
      t.wait(request, "native_allreduce (MPI_Iallreduce)");
    }
    if (op == comm::reduce_op::mean) comm::detail::divide(data, t.size());
  }

 private:
  static void check_same_count(transport& t, std::size_t count) {
    const auto mine = static_cast<std::int64_t>(count);
    std::int64_t extremes[2] = {mine, -mine};  // max of count and of −count
    MPI_Request request = MPI_REQUEST_NULL;
    mpi::detail::check(
        MPI_Iallreduce(MPI_IN_PLACE, extremes, 2, MPI_INT64_T, MPI_MAX, t.communicator(), &request),
        "MPI_Iallreduce (length check)");
    t.wait(request, "native_allreduce (length check)");
    if (extremes[0] != mine || -extremes[1] != mine)
      fail(errc::size_mismatch, cat("rank ", t.rank(), ": native_allreduce of ", count,
                                    " elements, but the ranks passed lengths from ", -extremes[1],
                                    " to ", extremes[0], "; every rank must pass the same length"));
  }
};

}  // namespace strata::mpi

/// @file nccl.cuh
/// NCCL on top of strata: `check(ncclResult_t)`, a communicator bootstrapped from an
/// ncclUniqueId distributed either over any strata transport (rank 0 calls `make_unique_id()`
/// and strata::comm::broadcast sends `id_bytes(id)` to the others — the MPI bootstrap) or
/// through a file on a shared filesystem (`unique_id_via_file`, when there is no MPI), and
/// `nccl_allreduce`. strata's own ring over ncclSend/ncclRecv is not provided (use NCCL's).
#pragma once

#if !defined(__CUDACC__)
#error \
    "strata/cuda/*.cuh are CUDA headers: include them only from .cu files compiled by nvcc (link strata::cuda)."
#endif

#include <cstddef>
#include <filesystem>
#include <span>
#include <utility>

#include <nccl.h>

#include "strata/comm/file_rendezvous.hpp"
#include "strata/cuda/common.cuh"

namespace strata::cuda {

/// Throws `strata::error` naming the call and file:line unless `r` is ncclSuccess.
inline void check(ncclResult_t r, const char* call = "NCCL call",
                  std::source_location where = std::source_location::current()) {
  if (r == ncclSuccess) [[likely]]
    return;
  detail::check_failed("NCCL", static_cast<int>(r), ncclGetErrorString(r), call, where);
}

/// A fresh NCCL unique id (call on one rank, then broadcast its bytes).
inline ncclUniqueId make_unique_id() {
  ncclUniqueId id;
  STRATA_CHECK(ncclGetUniqueId(&id));
  return id;
}
/// The id's bytes, for sending over a strata transport.
inline std::span<std::byte> id_bytes(ncclUniqueId& id) noexcept {
  return std::as_writable_bytes(std::span<ncclUniqueId, 1>(&id, 1));
}

/// The job's NCCL unique id through the file `path` (on a filesystem every rank shares, unique
/// to this job): rank 0 creates and publishes it (comm::publish_file: atomic, never overwrites
/// a leftover), every other rank waits up to `timeout_seconds` for it (comm::await_file:
/// `errc::timeout` naming the path, not a hang).
inline ncclUniqueId unique_id_via_file(const std::filesystem::path& path, int rank,
                                       double timeout_seconds = 60.0) {
  STRATA_EXPECTS(rank >= 0, "cuda::unique_id_via_file: rank must be >= 0, got ", rank);
  ncclUniqueId id{};
  if (rank == 0) {
    id = make_unique_id();
    comm::publish_file(path, id_bytes(id));
  } else {
    comm::await_file(path, id_bytes(id), timeout_seconds);
  }
  return id;
}

/// Owns an ncclComm_t for (rank, size) created from the shared id (ncclCommInitRank; blocks
/// until every rank has joined). Uses the current CUDA device. Move-only; destroying it calls
/// ncclCommDestroy. Calls on one communicator must be issued in the same order on every rank.
class communicator {
 public:
  communicator(const ncclUniqueId& id, int rank, int size) : rank_(rank), size_(size) {
    STRATA_EXPECTS(size > 0 && rank >= 0 && rank < size, "cuda::communicator: rank ", rank,
                   " is outside a world of ", size);
    STRATA_CHECK(ncclCommInitRank(&comm_, size, id, rank));
  }
  communicator(const communicator&) = delete;
  communicator& operator=(const communicator&) = delete;
  communicator(communicator&& o) noexcept
      : comm_(std::exchange(o.comm_, nullptr)), rank_(o.rank_), size_(o.size_) {}
  communicator& operator=(communicator&&) = delete;
  ~communicator() {
    if (comm_ != nullptr) (void)ncclCommDestroy(comm_);
  }
  [[nodiscard]] ncclComm_t get() const noexcept { return comm_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }

 private:
  ncclComm_t comm_ = nullptr;
  int rank_ = 0;
  int size_ = 1;
};

/// recv[i] ← Σ over ranks of send[i] (fp32, n values; send may equal recv), stream-ordered.
inline void nccl_allreduce(const communicator& comm, const float* send, float* recv, std::size_t n,
                           cudaStream_t stream, ncclRedOp_t op = ncclSum) {
  STRATA_CHECK(ncclAllReduce(send, recv, n, ncclFloat32, op, comm.get(), stream));
}

}  // namespace strata::cuda

/// @file nccl.cuh
/// NCCL on top of strata: `check(ncclResult_t)`, a communicator bootstrapped from an
/// ncclUniqueId distributed either over any strata transport (rank 0 calls `make_unique_id()`
/// and strata::comm::broadcast sends `id_bytes(id)` to the others — the MPI bootstrap) or
/// through a file on a shared filesystem (`unique_id_via_file`, when there is no MPI),
/// `nccl_allreduce` (NCCL's own), and strata's ring over ncclSend/ncclRecv (`ring`,
/// `ring_allreduce`, `compressed_ring_allreduce`): the same chunks and the same order of
/// additions as strata::comm::ring_allreduce and strata::compress::compressed_allreduce, so for
/// equal inputs the results are bitwise equal to the CPU collectives.
///
/// The codecs of the compressed ring come from strata/cuda/compress.cuh (include it too):
///
/// ```cpp
/// strata::cuda::communicator comm(id, rank, size);  // cudaSetDevice(device) first
/// strata::cuda::ring ring(comm);                    // keeps its scratch between calls
/// ring.allreduce(grad.data(), grad.size(), stream, strata::comm::reduce_op::mean);
/// ring.compressed_allreduce<strata::cuda::int8_block<256>>(grad.data(), grad.size(), stream);
/// ```
#pragma once

#if !defined(__CUDACC__)
#error \
    "strata/cuda/*.cuh are CUDA headers: include them only from .cu files compiled by nvcc (link strata::cuda)."
#endif

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <type_traits>
#include <utility>

#include <nccl.h>

#include "strata/comm/collectives.hpp"
#include "strata/comm/file_rendezvous.hpp"
#include "strata/compress/compressed_allreduce.hpp"
#include "strata/core/error.hpp"
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

/// A device codec the ring can carry: a static `encoded_bytes(n)` that is the exact message
/// size for n values (so a receiver knows every message's size from the element count, as a
/// CPU `fixed_size_compressor`), and stream-ordered static `encode(in, n, bytes, stream)`,
/// `decode(bytes, n, out, stream)` and `decode_add(bytes, n, acc, stream)` on device pointers.
/// Models: cuda::fp16 and cuda::int8_block<B> (same bytes as compress::fp16 / int8_block<B>).
/// cuda::topk is not one (its size is only a bound, and it is an object bound to one stream).
template <class C>
concept device_codec = requires(const float* in, float* out, std::size_t n, std::byte* bytes,
                                const std::byte* message, cudaStream_t stream) {
  { C::encoded_bytes(n) } -> std::convertible_to<std::size_t>;
  C::encode(in, n, bytes, stream);
  C::decode(message, n, out, stream);
  C::decode_add(message, n, out, stream);
};

namespace detail {

// The ring's kernels are templates (instantiated for float only) so that they have vague
// linkage: several .cu files of one program may include this header without duplicate symbols.

/// acc[i] ← acc[i] + in[i]: one IEEE add rounded to nearest per element (__fadd_rn is never
/// contracted into an FMA), the operation the CPU ring performs.
template <class V>
__global__ void ring_add_kernel(V* __restrict acc, const V* __restrict in, std::size_t n) {
  static_assert(std::is_same_v<V, float>, "ring_add_kernel adds fp32 values");
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    acc[i] = __fadd_rn(acc[i], in[i]);
}

/// v[i] ← v[i] · factor (rounded to nearest), as comm::detail::divide for floats.
template <class V>
__global__ void ring_scale_kernel(V* __restrict v, std::size_t n, V factor) {
  static_assert(std::is_same_v<V, float>, "ring_scale_kernel scales fp32 values");
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < n;
       i += std::size_t{gridDim.x} * blockDim.x)
    v[i] = __fmul_rn(v[i], factor);
}

inline void ring_add(float* acc, const float* in, std::size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ring_add_kernel<float><<<grid_for(n), 256, 0, stream>>>(acc, in, n);
  check_launch("ring_add_kernel", stream);
}

/// The mean's division: v ← v · (1 / ranks), the float arithmetic of comm::detail::divide.
inline void ring_divide(float* v, std::size_t n, int ranks, cudaStream_t stream) {
  if (n == 0) return;
  const float factor = 1.0f / static_cast<float>(ranks);
  ring_scale_kernel<float><<<grid_for(n), 256, 0, stream>>>(v, n, factor);
  check_launch("ring_scale_kernel", stream);
}

/// Scratch of the ring algorithms: the fp32 receive chunk, and the two message buffers of the
/// compressed ring. Kept between calls by `ring`; see `ring_buffer`.
struct ring_workspace {
  device_buffer<float> floats;
  device_buffer<std::byte> outgoing;
  device_buffer<std::byte> incoming;
};

/// `b`'s memory for at least n elements on `stream`. Reallocates (stream-ordered, no host
/// wait) when b is too small or was allocated on another stream: the old array is then freed
/// in the order of the stream that used it, so a call on a new stream never races the last one.
template <class T>
T* ring_buffer(device_buffer<T>& b, std::size_t n, cudaStream_t stream) {
  if (b.size() < n || b.stream() != stream) b = device_buffer<T>(n, stream);
  return b.data();
}

/// Elements [at, at + count) of the buffer.
struct ring_piece {
  std::size_t at = 0;
  std::size_t count = 0;
};

/// The plain ring of `ring::allreduce` over any `link`, a callable
/// `link(const std::byte* send, std::size_t send_bytes, std::byte* recv, std::size_t recv_bytes,
/// cudaStream_t)` that sends `send` to the right neighbour (rank + 1) and receives the left
/// neighbour's bytes into `recv`, ordered on the stream (work queued after it sees both done).
/// Every rank calls link the same number of times with matching sizes (rank r's send_bytes =
/// rank r+1's recv_bytes); both may be 0. The schedule is that of comm::ring_allreduce: column
/// by column (chunk `offset` of every segment), a reduce-scatter of size−1 steps (send
/// piece(rank − step), add the incoming piece(rank − step − 1) into place), the mean's
/// division of the finished piece(rank + 1), then an all-gather of size−1 steps (send
/// piece(rank + 1 − step), receive piece(rank − step) in place). Columns only bound the
/// scratch (`chunk_floats` floats); they do not change any value.
template <class Link>
void run_ring(Link&& link, int rank, int size, float* data, std::size_t n, std::size_t chunk_floats,
              comm::reduce_op op, ring_workspace& workspace, cudaStream_t stream) {
  if (size == 1) return;
  const auto parts = static_cast<std::size_t>(size);
  const std::size_t longest = (n + parts - 1) / parts;
  if (longest == 0) return;
  const std::size_t chunk = std::min(chunk_floats, longest);
  float* scratch = ring_buffer(workspace.floats, chunk, stream);
  const auto piece = [&](long long index, std::size_t offset) {
    const auto s = comm::detail::split(n, parts, comm::detail::wrap(index, size));
    const std::size_t begin = std::min(offset, s.size());
    return ring_piece{s.begin + begin, std::min(offset + chunk, s.size()) - begin};
  };
  const auto bytes_at = [&](std::size_t at) { return reinterpret_cast<std::byte*>(data + at); };
  for (std::size_t offset = 0; offset < longest; offset += chunk) {
    // Reduce-scatter: after size−1 steps this rank holds the full sum of piece(rank + 1).
    for (int step = 0; step < size - 1; ++step) {
      const ring_piece out = piece(rank - step, offset), in = piece(rank - step - 1, offset);
      link(bytes_at(out.at), out.count * sizeof(float), reinterpret_cast<std::byte*>(scratch),
           in.count * sizeof(float), stream);
      ring_add(data + in.at, scratch, in.count, stream);
    }
    if (op == comm::reduce_op::mean) {
      const ring_piece own = piece(rank + 1, offset);
      ring_divide(data + own.at, own.count, size, stream);
    }
    // All-gather: the finished pieces travel around the ring, received in place.
    for (int step = 0; step < size - 1; ++step) {
      const ring_piece out = piece(rank + 1 - step, offset), in = piece(rank - step, offset);
      link(bytes_at(out.at), out.count * sizeof(float), bytes_at(in.at), in.count * sizeof(float),
           stream);
    }
  }
}

/// The compressed ring of `ring::compressed_allreduce` over any `link` (as in run_ring): the
/// message schedule of compress::compressed_allreduce, operation for operation. Reduce-scatter,
/// chunk by chunk (chunk = min(chunk_floats, longest segment)) and step by step: encode this
/// rank's chunk of segment rank − step, exchange, `decode_add` the left neighbour's message
/// into the chunk of segment rank − step − 1. Then the mean's division of the owned segment
/// rank + 1. All-gather, chunk by chunk: encode the owned chunk once, overwrite it with its own
/// decoding, then size−1 steps that send the current message and receive the next one, decode
/// it into the chunk of segment rank − step and forward it unchanged at the next step.
template <device_codec Codec, class Link>
void run_compressed_ring(Link&& link, int rank, int size, float* data, std::size_t n,
                         std::size_t chunk_floats, comm::reduce_op op, ring_workspace& workspace,
                         cudaStream_t stream) {
  if (size == 1) return;
  const auto parts = static_cast<std::size_t>(size);
  const std::size_t longest = (n + parts - 1) / parts;
  if (longest == 0) return;
  const std::size_t chunk = std::min(chunk_floats, longest);
  const std::size_t capacity = Codec::encoded_bytes(chunk);
  std::byte* send = ring_buffer(workspace.outgoing, capacity, stream);
  std::byte* recv = ring_buffer(workspace.incoming, capacity, stream);
  const auto seg = [&](long long index) {
    return comm::detail::split(n, parts, comm::detail::wrap(index, size));
  };
  // The chunk at `offset` of segment s (empty past the segment's end), as compressed_allreduce.
  const auto chunk_of = [&](comm::detail::segment s, std::size_t offset) {
    const std::size_t count = s.size() > offset ? std::min(chunk, s.size() - offset) : 0;
    return ring_piece{s.begin + std::min(offset, s.size()), count};
  };
  for (std::size_t offset = 0; offset < longest; offset += chunk) {
    for (int step = 0; step < size - 1; ++step) {
      const ring_piece out = chunk_of(seg(rank - step), offset);
      const ring_piece in = chunk_of(seg(rank - step - 1), offset);
      Codec::encode(data + out.at, out.count, send, stream);
      link(send, Codec::encoded_bytes(out.count), recv, Codec::encoded_bytes(in.count), stream);
      Codec::decode_add(recv, in.count, data + in.at, stream);
    }
  }
  const auto owned = seg(rank + 1);
  if (op == comm::reduce_op::mean) ring_divide(data + owned.begin, owned.size(), size, stream);
  for (std::size_t offset = 0; offset < longest; offset += chunk) {
    const ring_piece own = chunk_of(owned, offset);
    Codec::encode(data + own.at, own.count, send, stream);
    Codec::decode(send, own.count, data + own.at, stream);
    std::size_t bytes = Codec::encoded_bytes(own.count);
    for (int step = 0; step < size - 1; ++step) {
      const ring_piece in = chunk_of(seg(rank - step), offset);
      link(send, bytes, recv, Codec::encoded_bytes(in.count), stream);
      Codec::decode(recv, in.count, data + in.at, stream);
      bytes = Codec::encoded_bytes(in.count);
      std::swap(send, recv);  // forward what arrived
    }
  }
}

/// One ring step over NCCL: ncclGroupStart, ncclSend to `right`, ncclRecv from `left`,
/// ncclGroupEnd, on `stream`. A side with 0 bytes is left out and a step with nothing to move
/// is skipped; every rank computes the same sizes, so the skipped halves match up.
struct nccl_link {
  ncclComm_t comm;
  int right;
  int left;
  std::uint64_t* sent;

  void operator()(const std::byte* send, std::size_t send_bytes, std::byte* recv,
                  std::size_t recv_bytes, cudaStream_t stream) const {
    if (send_bytes == 0 && recv_bytes == 0) return;
    STRATA_CHECK(ncclGroupStart());
    // ncclGroupEnd must close the group even when a call inside it failed.
    const ncclResult_t sent_ok =
        send_bytes > 0 ? ncclSend(send, send_bytes, ncclUint8, right, comm, stream) : ncclSuccess;
    const ncclResult_t received_ok = recv_bytes > 0 && sent_ok == ncclSuccess
                                         ? ncclRecv(recv, recv_bytes, ncclUint8, left, comm, stream)
                                         : ncclSuccess;
    const ncclResult_t ended = ncclGroupEnd();
    check(sent_ok, "ncclSend(chunk, to the right neighbour)");
    check(received_ok, "ncclRecv(chunk, from the left neighbour)");
    check(ended, "ncclGroupEnd() of a ring step");
    *sent += send_bytes;
  }
};

/// Throws errc::invalid_argument unless `data` can hold n floats of a ring on `device`: not
/// null when n > 0 (checked first, before any CUDA call), and device memory of that device
/// (or managed memory).
inline void check_ring_data(const char* who, const float* data, std::size_t n, int device) {
  STRATA_EXPECTS(data != nullptr || n == 0, who, ": data is null but n = ", n,
                 "; pass a device pointer to n floats (or n = 0)");
  if (n == 0) return;
  cudaPointerAttributes attributes{};
  const cudaError_t e = cudaPointerGetAttributes(&attributes, data);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(errc::invalid_argument,
         cat(who, ": cannot query the memory of data (cudaPointerGetAttributes: ",
             cudaGetErrorString(e), "); pass device memory of the communicator's device ", device));
  }
  if (attributes.type == cudaMemoryTypeManaged) return;
  if (attributes.type != cudaMemoryTypeDevice)
    fail(errc::invalid_argument,
         cat(who, ": data (", static_cast<const void*>(data), ") is ",
             attributes.type == cudaMemoryTypeHost ? "pinned host memory" : "host memory",
             ", not device memory; NCCL and the add kernel need a device pointer (cudaMalloc, "
             "cuda::device_buffer) on the communicator's device ",
             device));
  if (attributes.device != device)
    fail(errc::invalid_argument,
         cat(who, ": data is on device ", attributes.device, " but the communicator uses device ",
             device, "; allocate the buffer on the communicator's device"));
}

}  // namespace detail

/// strata's ring allreduce on GPUs: reduce-scatter then all-gather around the ring of a
/// `communicator` (rank r sends to r + 1 and receives from r − 1), each step one
/// ncclGroupStart / ncclSend / ncclRecv / ncclGroupEnd, a kernel adding the received chunk.
///
/// Order of additions (that of strata::comm::ring_allreduce, so equal inputs give bitwise equal
/// results, and every rank ends with the same bits): the n values are cut into `size`
/// segments by comm::detail::split (the first n % size segments one element longer); every
/// element of segment j is summed as ((x_j + x_{j+1}) + x_{j+2}) + … + x_{j+size−1} (rank
/// indices mod size; each + one IEEE fp32 add rounded to nearest, never fused), by rank j−1,
/// which then sends the result around the ring. `mean` multiplies that sum by 1.0f / size.
/// Columns of `chunk_floats` values only bound message and scratch sizes; they never change
/// a value. Traffic per rank: 2(size−1)/size · 4n bytes in 2(size−1) messages per column.
///
/// `compressed_allreduce<Codec>` mirrors compress::compressed_allreduce with the equivalent CPU
/// codec (cuda::fp16 ↔ compress::fp16, cuda::int8_block<B> ↔ compress::int8_block<B>): the
/// same messages with the same bytes, and bitwise the same result; see its comment.
///
/// Calls are stream-ordered and asynchronous (no host wait): `data` may be read once the
/// stream has passed the call. Scratch (one chunk of floats, or two messages) is allocated on
/// the stream on first use and kept; it is reallocated when a call needs more or uses another
/// stream, so a stream passed in must stay alive until the ring is destroyed or next called
/// with another stream. Every rank must make the same calls in the same order with the same
/// n, op, chunk and codec (NCCL cannot detect a mismatch: it hangs or truncates). With one
/// rank a call checks its arguments and leaves `data` as it is. Arguments are checked on the
/// host before anything is queued (null data with n > 0, memory that is not the
/// communicator's device memory, a current device that is not the communicator's, chunk 0:
/// errc::invalid_argument). Holds a reference to `comm`, which must outlive it. Not
/// thread-safe; use it from the thread whose current device is the communicator's.
class ring {
 public:
  /// Default column of the plain ring: 2^22 floats (16 MiB) per message.
  static constexpr std::size_t default_chunk_floats = std::size_t{1} << 22;

  explicit ring(const communicator& comm) : comm_(&comm) {
    STRATA_EXPECTS(comm.get() != nullptr,
                   "cuda::ring: the communicator is empty (moved from); pass a live one");
    STRATA_CHECK(ncclCommCuDevice(comm.get(), &device_));
  }

  /// data[i] ← Σ over ranks of data[i] (or the mean), in place, for n floats in device
  /// memory. Any n ≥ 0 (ranks with an empty segment send empty messages, which are skipped).
  void allreduce(float* data, std::size_t n, cudaStream_t stream,
                 comm::reduce_op op = comm::reduce_op::sum,
                 std::size_t chunk_floats = default_chunk_floats) {
    prepare("cuda::ring::allreduce", data, n, chunk_floats);
    detail::run_ring(link(), rank(), size(), data, n, chunk_floats, op, workspace_, stream);
  }

  /// The ring of compress::compressed_allreduce with a device codec: every message is
  /// Codec-encoded. Reduce-scatter: each hop sends this rank's encoded partial-sum chunk and
  /// `decode_add`s the left neighbour's into its own; all-gather: the owner of each finished
  /// chunk encodes it once, adopts decode(encode(chunk)), and those bytes travel unchanged
  /// around the ring. With `chunk_floats` equal to the CPU call's (default: the CPU default
  /// compress::default_chunk_floats) every message has the bytes the CPU version sends and the
  /// result is bitwise the CPU result. Not sent: the CPU's 8-byte element-count check per call
  /// (that needs a host wait; equal n on every rank is the caller's duty here). There is no
  /// error feedback on the device: each call's codec error is lost, as with the CPU codec alone.
  template <device_codec Codec>
  void compressed_allreduce(float* data, std::size_t n, cudaStream_t stream,
                            comm::reduce_op op = comm::reduce_op::sum,
                            std::size_t chunk_floats = compress::default_chunk_floats) {
    prepare("cuda::ring::compressed_allreduce", data, n, chunk_floats);
    detail::run_compressed_ring<Codec>(link(), rank(), size(), data, n, chunk_floats, op,
                                       workspace_, stream);
  }

  /// Payload bytes this ring has handed to ncclSend so far (all calls; host arithmetic).
  [[nodiscard]] std::uint64_t bytes_sent() const noexcept { return sent_; }
  [[nodiscard]] int rank() const noexcept { return comm_->rank(); }
  [[nodiscard]] int size() const noexcept { return comm_->size(); }
  /// The communicator's CUDA device (ncclCommCuDevice).
  [[nodiscard]] int device() const noexcept { return device_; }

 private:
  void prepare(const char* who, const float* data, std::size_t n, std::size_t chunk_floats) const {
    STRATA_EXPECTS(chunk_floats >= 1, who, ": chunk_floats must be at least 1");
    detail::check_ring_data(who, data, n, device_);
    int current = -1;
    STRATA_CHECK(cudaGetDevice(&current));
    STRATA_EXPECTS(current == device_, who, ": rank ", rank(), "'s communicator uses device ",
                   device_, " but the current device is ", current, "; call cudaSetDevice(",
                   device_, ") in this thread first");
  }

  [[nodiscard]] detail::nccl_link link() noexcept {
    const int n = size();
    return {comm_->get(), (rank() + 1) % n, (rank() + n - 1) % n, &sent_};
  }

  const communicator* comm_;
  int device_ = -1;
  detail::ring_workspace workspace_;
  std::uint64_t sent_ = 0;
};

/// One-off `ring(comm).allreduce(...)`: in-place sum (or mean) of n device floats over all
/// ranks, bitwise equal to strata::comm::ring_allreduce on the same inputs. Its scratch is
/// allocated and freed on `stream` (no host wait); keep a `ring` to reuse it across calls.
inline void ring_allreduce(const communicator& comm, float* data, std::size_t n,
                           cudaStream_t stream,
                           strata::comm::reduce_op op = strata::comm::reduce_op::sum,
                           std::size_t chunk_floats = ring::default_chunk_floats) {
  ring{comm}.allreduce(data, n, stream, op, chunk_floats);
}

/// One-off `ring(comm).compressed_allreduce<Codec>(...)`: the device twin of
/// strata::compress::compressed_allreduce (same messages, same bytes, same result).
template <device_codec Codec>
void compressed_ring_allreduce(const communicator& comm, float* data, std::size_t n,
                               cudaStream_t stream,
                               strata::comm::reduce_op op = strata::comm::reduce_op::sum,
                               std::size_t chunk_floats = compress::default_chunk_floats) {
  ring{comm}.compressed_allreduce<Codec>(data, n, stream, op, chunk_floats);
}

}  // namespace strata::cuda

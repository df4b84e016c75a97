// strata's ring allreduce over NCCL (cuda::ring, ring_allreduce, compressed_ring_allreduce)
// against the CPU collectives it mirrors: strata::comm::ring_allreduce and
// strata::compress::compressed_allreduce run on a thread_world with the same inputs must give
// the same bits and the same bytes on the wire; a float64 sum bounds the error.
//
// NCCL refuses two ranks on one GPU, so the NCCL cases need >= 2 devices (one thread per
// device). With one device the ring's schedule and kernels (cuda::detail::run_ring and
// run_compressed_ring, which the NCCL ring runs too) are checked over a stand-in link that
// copies between simulated ranks on that device; only the ncclSend/ncclRecv step is then left
// out. Without a device every GPU case is skipped with a WARN.
#include "cuda/test_support.cuh"

#include <atomic>
#include <barrier>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/compress/compressed_allreduce.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/core/rng.hpp"
#include "strata/cuda/compress.cuh"
#include "strata/cuda/nccl.cuh"

namespace sc = strata::cuda;
namespace compress = strata::compress;
namespace cuda_test = strata::cuda_test;
using strata::errc;
using strata::comm::reduce_op;
using strata::cuda_test::skip_without_gpu;

namespace {

/// True (after strata_test::skip) when fewer than `needed` CUDA devices are visible.
bool skip_without_gpus(int needed) {
  const int found = sc::device_count();
  if (found >= needed) return false;
  strata_test::skip("needs >= " + std::to_string(needed) + " GPUs, found " + std::to_string(found) +
                    " (NCCL refuses two ranks on one device); this NCCL test was compiled but not "
                    "run. Run scripts/gpu-check.sh on a multi-GPU machine.");
  return true;
}

/// Input value i of `rank` for `seed`: uniform in [-1, 1) times 2^e, e in [-8, 8], so the
/// order of additions shows in the rounding (about one sum in five changes with the order).
float input_value(std::uint64_t seed, int rank, std::size_t i) {
  const std::uint64_t z = strata::counter_rng{seed, static_cast<std::uint64_t>(rank)}.bits(i);
  const float u = static_cast<float>(z >> 40) * 0x1p-23f - 1.0f;
  return std::ldexp(u, static_cast<int>((z >> 8) % 17) - 8);
}

std::vector<float> inputs(std::uint64_t seed, int rank, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = input_value(seed, rank, i);
  return v;
}

/// What a job runs: the plain ring, the compressed ring with one codec, or NCCL's allreduce.
enum class algo { plain, fp16, int8_256, int8_64, native };

const char* name_of(algo a) {
  switch (a) {
    case algo::plain:
      return "plain";
    case algo::fp16:
      return "fp16";
    case algo::int8_256:
      return "int8_block<256>";
    case algo::int8_64:
      return "int8_block<64>";
    case algo::native:
      return "ncclAllReduce";
  }
  return "?";
}

/// One allreduce of n values per rank. `chunk`: chunk_floats of the GPU call (the compressed
/// CPU reference gets the same; the plain CPU ring keeps its own 1 MiB columns, which must not
/// matter).
struct job {
  algo what = algo::plain;
  reduce_op op = reduce_op::sum;
  std::size_t n = 0;
  std::size_t chunk = 0;
  std::uint64_t seed = 0;
  bool one_off = false;  ///< through ring_allreduce / compressed_ring_allreduce (bytes not seen)
};

/// One rank's result: its values after the call and the payload bytes it sent.
struct rank_out {
  std::vector<float> values;
  std::uint64_t bytes = 0;
};

/// Runs `what` on a ring-like object (cuda::ring or sim_ring) for one rank of a job.
template <class Ring>
rank_out run_job(Ring& ring, cudaStream_t stream, const job& j, int rank) {
  const auto host = inputs(j.seed, rank, j.n);
  sc::device_buffer<float> d(std::span<const float>(host), stream);
  const std::uint64_t before = ring.bytes_sent();
  switch (j.what) {
    case algo::plain:
      ring.allreduce(d.data(), j.n, stream, j.op, j.chunk);
      break;
    case algo::fp16:
      ring.template compressed_allreduce<sc::fp16>(d.data(), j.n, stream, j.op, j.chunk);
      break;
    case algo::int8_256:
      ring.template compressed_allreduce<sc::int8_block<256>>(d.data(), j.n, stream, j.op, j.chunk);
      break;
    case algo::int8_64:
      ring.template compressed_allreduce<sc::int8_block<64>>(d.data(), j.n, stream, j.op, j.chunk);
      break;
    case algo::native:
      throw std::logic_error("run_job: ncclAllReduce needs the communicator");
  }
  return {d.download(), ring.bytes_sent() - before};
}

/// run_job's interface over the one-off free functions (which keep no byte count).
struct one_off_ring {
  const sc::communicator& comm;
  void allreduce(float* data, std::size_t n, cudaStream_t stream, reduce_op op,
                 std::size_t chunk_floats) {
    sc::ring_allreduce(comm, data, n, stream, op, chunk_floats);
  }
  template <sc::device_codec Codec>
  void compressed_allreduce(float* data, std::size_t n, cudaStream_t stream, reduce_op op,
                            std::size_t chunk_floats) {
    sc::compressed_ring_allreduce<Codec>(comm, data, n, stream, op, chunk_floats);
  }
  [[nodiscard]] std::uint64_t bytes_sent() const noexcept { return 0; }
};

/// The CPU collectives on a thread_world with the same inputs: values and bytes each rank sent
/// to its right neighbour (which include the 8-byte element-count check of every call).
std::vector<rank_out> cpu_reference(int ranks, const job& j) {
  strata::comm::thread_world world(ranks);
  std::vector<rank_out> out(static_cast<std::size_t>(ranks));
  world.run([&](strata::comm::thread_transport& t) {
    auto values = inputs(j.seed, t.rank(), j.n);
    const std::span<float> d(values);
    switch (j.what) {
      case algo::plain:
      case algo::native:
        strata::comm::allreduce(t, d, j.op);
        break;
      case algo::fp16: {
        compress::fp16 codec;
        compress::compressed_allreduce(t, d, codec, j.op, j.chunk);
        break;
      }
      case algo::int8_256: {
        compress::int8_block<256> codec;
        compress::compressed_allreduce(t, d, codec, j.op, j.chunk);
        break;
      }
      case algo::int8_64: {
        compress::int8_block<64> codec;
        compress::compressed_allreduce(t, d, codec, j.op, j.chunk);
        break;
      }
    }
    out[static_cast<std::size_t>(t.rank())].values = std::move(values);
  });
  for (int r = 0; r < ranks; ++r)
    out[static_cast<std::size_t>(r)].bytes = world.bytes_sent(r, (r + 1) % ranks);
  return out;
}

/// The exact (float64) result of a job and a bound on each value's error.
/// Plain ring and NCCL: 1e-5 · Σ|x| (relative to the sum of magnitudes, which is what a
/// float sum's rounding scales with). fp16: each of the `ranks` encodings of a (partial) sum
/// errs by ≤ 2^-11 relative + 2^-25 absolute. int8_block<B>: each encoding errs by ≤ absmax of
/// its quantisation block / 254 (blocks start at each chunk of each segment, as the codec sees
/// them), so the bound uses the largest Σ|x| in the value's block.
struct exact_reference {
  std::vector<double> want, bound;

  exact_reference(const job& j, int ranks) : want(j.n, 0.0), bound(j.n, 0.0) {
    std::vector<double> scale(j.n, 0.0);
    for (int r = 0; r < ranks; ++r)
      for (std::size_t i = 0; i < j.n; ++i) {
        const double x = input_value(j.seed, r, i);
        want[i] += x;
        scale[i] += std::fabs(x);
      }
    if (j.op == reduce_op::mean)
      for (std::size_t i = 0; i < j.n; ++i) {
        want[i] /= ranks;
        scale[i] /= ranks;
      }
    const double k = ranks;
    switch (j.what) {
      case algo::plain:
      case algo::native:
        for (std::size_t i = 0; i < j.n; ++i)
          bound[i] = 1e-5 * scale[i] + 1e-30;
        break;
      case algo::fp16:
        for (std::size_t i = 0; i < j.n; ++i)
          bound[i] = k * (0x1p-10 * scale[i] + 0x1p-24);
        break;
      case algo::int8_256:
        int8_bound(j, ranks, 256, scale);
        break;
      case algo::int8_64:
        int8_bound(j, ranks, 64, scale);
        break;
    }
  }

 private:
  void int8_bound(const job& j, int ranks, std::size_t block, const std::vector<double>& scale) {
    const auto parts = static_cast<std::size_t>(ranks);
    const std::size_t longest = (j.n + parts - 1) / parts;
    const std::size_t chunk = std::min(j.chunk, std::max<std::size_t>(longest, 1));
    for (std::size_t s = 0; s < parts; ++s) {
      const auto seg = strata::comm::detail::split(j.n, parts, s);
      for (std::size_t at = seg.begin; at < seg.end;) {
        // One quantisation block: it never crosses a chunk (nor a segment).
        const std::size_t in_chunk = (at - seg.begin) % chunk;
        const std::size_t len = std::min({block, chunk - in_chunk, seg.end - at});
        double top = 0.0;
        for (std::size_t i = at; i < at + len; ++i)
          top = std::max(top, scale[i]);
        for (std::size_t i = at; i < at + len; ++i)
          // (1 + ranks/254): earlier encodings' errors may enlarge the partial sums encoded.
          bound[i] =
              ranks * (top * (1.0 + ranks / 254.0) * 1.001 / 254.0 + 0x1p-23 * scale[i]) + 1e-30;
        at += len;
      }
    }
  }
};

void require_within(const std::vector<float>& got, const exact_reference& ref) {
  REQUIRE(got.size() == ref.want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = ref.want[i], b = ref.bound[i];
    const bool ok = std::fabs(g - w) <= b;
    if (!ok) {
      CAPTURE(i, g, w, b);
      REQUIRE(ok);
    }
  }
}

/// The checks of one job: bitwise equal to the CPU collective on every rank, the CPU's payload
/// bytes minus its 8-byte count check, and within the bound of the exact sum.
void check_job(const job& j, int ranks, const std::vector<rank_out>& got) {
  CAPTURE(name_of(j.what), j.op == reduce_op::mean, j.n, j.chunk, ranks, j.seed);
  REQUIRE(got.size() == static_cast<std::size_t>(ranks));
  if (j.what != algo::native) {
    const auto cpu = cpu_reference(ranks, j);
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r);
      const auto& g = got[static_cast<std::size_t>(r)];
      const auto& c = cpu[static_cast<std::size_t>(r)];
      cuda_test::require_bits_equal(g.values, c.values);
      if (!j.one_off) CHECK(g.bytes + (ranks > 1 ? 8 : 0) == c.bytes);
    }
  }
  const exact_reference ref(j, ranks);
  for (int r = 0; r < ranks; ++r) {
    CAPTURE(r);
    require_within(got[static_cast<std::size_t>(r)].values, ref);
  }
}

/// One thread per rank that lives across jobs: `start(rank)` runs first on each thread (a
/// failure there is rethrown by the constructor), `run(fn)` runs fn(rank) on every thread and
/// waits, rethrowing the lowest rank's exception, and `stop(rank)` runs on each thread when the
/// pool is destroyed. (NCCL communicators are created and destroyed on their own threads.)
class rank_pool {
 public:
  rank_pool(int ranks, std::function<void(int)> start, std::function<void(int)> stop)
      : ranks_(ranks),
        start_(std::move(start)),
        stop_(std::move(stop)),
        errors_(static_cast<std::size_t>(ranks)) {
    threads_.reserve(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r)
      threads_.emplace_back([this, r] { loop(r); });
    try {
      run([](int) {});  // every start has finished (or failed)
    } catch (...) {
      shutdown();
      throw;
    }
  }
  rank_pool(const rank_pool&) = delete;
  rank_pool& operator=(const rank_pool&) = delete;
  ~rank_pool() { shutdown(); }

  void run(const std::function<void(int)>& fn) {
    std::unique_lock lock(mutex_);
    work_ = &fn;
    done_ = 0;
    ++generation_;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    lock.unlock();
    wake_.notify_all();
    lock.lock();
    finished_.wait(lock, [&] { return done_ == ranks_; });
    for (const auto& e : errors_)
      if (e) std::rethrow_exception(e);
  }

 private:
  void loop(int rank) {
    std::exception_ptr start_error;
    try {
      start_(rank);
    } catch (...) {
      start_error = std::current_exception();
    }
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void(int)>* work = nullptr;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return quit_ || generation_ != seen; });
        if (quit_) break;
        seen = generation_;
        work = work_;
      }
      std::exception_ptr error = start_error;
      if (!error) {
        try {
          (*work)(rank);
        } catch (...) {
          error = std::current_exception();
        }
      }
      {
        std::lock_guard lock(mutex_);
        errors_[static_cast<std::size_t>(rank)] = error;
        ++done_;
      }
      finished_.notify_all();
    }
    try {
      stop_(rank);
    } catch (...) {  // a destructor path: nothing to report to
    }
  }

  void shutdown() {
    {
      std::lock_guard lock(mutex_);
      quit_ = true;
    }
    wake_.notify_all();
    threads_.clear();  // joins
  }

  int ranks_;
  std::function<void(int)> start_, stop_;
  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  const std::function<void(int)>* work_ = nullptr;
  std::uint64_t generation_ = 0;
  int done_ = 0;
  bool quit_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::jthread> threads_;
};

/// `size` ranks on one GPU, one thread each, linked by device copies: the stand-in for NCCL
/// that lets one device run the ring's real schedule and kernels. exchange() publishes this
/// rank's message, copies the left neighbour's message into `recv` on this rank's stream (after
/// the neighbour's stream has produced it) and returns once the right neighbour's copy of this
/// rank's message is ordered before later work on this stream, like a completed NCCL step.
/// Both host barriers are per step, so every rank must call exchange equally often.
class sim_world {
 public:
  explicit sim_world(int size)
      : size_(size),
        sync_(size),
        slots_(static_cast<std::size_t>(size)),
        ready_(static_cast<std::size_t>(size)),
        copied_(static_cast<std::size_t>(size)) {}

  [[nodiscard]] int size() const noexcept { return size_; }
  /// True once a step's sizes did not pair up (rank r's send ≠ rank r+1's receive).
  [[nodiscard]] bool mismatch() const noexcept { return mismatch_; }

  void exchange(int rank, const std::byte* send, std::size_t send_bytes, std::byte* recv,
                std::size_t recv_bytes, cudaStream_t stream) {
    const auto me = static_cast<std::size_t>(rank);
    const auto left = static_cast<std::size_t>((rank + size_ - 1) % size_);
    const auto right = static_cast<std::size_t>((rank + 1) % size_);
    ready_[me].record(stream);
    slots_[me] = {send, send_bytes};
    sync_.arrive_and_wait();
    if (!broken_) {
      const slot from = slots_[left];
      if (from.bytes != recv_bytes) {
        mismatch_ = true;
      } else if (recv_bytes > 0) {
        ready_[left].wait_on(stream);
        STRATA_CHECK(
            cudaMemcpyAsync(recv, from.data, recv_bytes, cudaMemcpyDeviceToDevice, stream));
      }
    }
    copied_[me].record(stream);
    sync_.arrive_and_wait();
    copied_[right].wait_on(stream);
  }

  /// A rank that failed leaves the barrier, so the others finish instead of waiting forever.
  void drop() {
    broken_ = true;
    sync_.arrive_and_drop();
  }

 private:
  struct slot {
    const std::byte* data = nullptr;
    std::size_t bytes = 0;
  };
  int size_;
  std::barrier<> sync_;
  std::vector<slot> slots_;
  std::vector<sc::event> ready_, copied_;
  std::atomic<bool> mismatch_{false}, broken_{false};
};

/// cuda::ring's interface over sim_world: the same detail::run_ring / run_compressed_ring with
/// the same kept workspace, only the link differs.
class sim_ring {
 public:
  sim_ring(sim_world& world, int rank) : world_(world), rank_(rank) {}

  /// The link run_ring calls: counts the bytes and exchanges through the world.
  auto link() {
    return [this](const std::byte* send, std::size_t send_bytes, std::byte* recv,
                  std::size_t recv_bytes, cudaStream_t stream) {
      sent_ += send_bytes;
      world_.exchange(rank_, send, send_bytes, recv, recv_bytes, stream);
    };
  }

  void allreduce(float* data, std::size_t n, cudaStream_t stream, reduce_op op,
                 std::size_t chunk_floats) {
    sc::detail::run_ring(link(), rank_, world_.size(), data, n, chunk_floats, op, workspace_,
                         stream);
  }
  template <sc::device_codec Codec>
  void compressed_allreduce(float* data, std::size_t n, cudaStream_t stream, reduce_op op,
                            std::size_t chunk_floats) {
    sc::detail::run_compressed_ring<Codec>(link(), rank_, world_.size(), data, n, chunk_floats, op,
                                           workspace_, stream);
  }
  [[nodiscard]] std::uint64_t bytes_sent() const noexcept { return sent_; }

 private:
  sim_world& world_;
  int rank_;
  sc::detail::ring_workspace workspace_;
  std::uint64_t sent_ = 0;
};

/// `ranks` simulated ranks on device 0, each on its own thread with two streams (jobs alternate
/// between them, so the kept scratch also moves between streams) and one sim_ring for all jobs.
/// Construct it with device 0 current (its events belong to the current device).
class simulated_ranks {
 public:
  explicit simulated_ranks(int ranks)
      : world_(ranks),
        state_(static_cast<std::size_t>(ranks)),
        pool_(
            ranks,
            [this](int r) {
              STRATA_CHECK(cudaSetDevice(0));
              state_[static_cast<std::size_t>(r)].emplace(world_, r);
            },
            [this](int r) { state_[static_cast<std::size_t>(r)].reset(); }) {}

  std::vector<rank_out> run(const job& j) {
    std::vector<rank_out> out(state_.size());
    pool_.run([&](int r) {
      auto& s = *state_[static_cast<std::size_t>(r)];
      try {
        out[static_cast<std::size_t>(r)] = run_job(s.ring, s.streams[s.jobs++ % 2], j, r);
      } catch (...) {
        world_.drop();
        throw;
      }
    });
    REQUIRE_FALSE(world_.mismatch());
    return out;
  }

 private:
  struct rank_state {
    rank_state(sim_world& world, int rank) : ring(world, rank) {}
    sc::stream streams[2];
    sim_ring ring;
    std::size_t jobs = 0;
  };
  sim_world world_;
  std::vector<std::optional<rank_state>> state_;
  rank_pool pool_;  // last: its threads are joined (and the states reset) first
};

/// `ranks` NCCL ranks, rank r on device r and its own thread, each with a communicator, two
/// streams (jobs alternate) and one cuda::ring kept for all jobs.
class nccl_ranks {
 public:
  explicit nccl_ranks(int ranks)
      : id_(sc::make_unique_id()),
        state_(static_cast<std::size_t>(ranks)),
        pool_(
            ranks,
            [this, ranks](int r) {
              STRATA_CHECK(cudaSetDevice(r));
              state_[static_cast<std::size_t>(r)].emplace(id_, r, ranks);
            },
            [this](int r) { state_[static_cast<std::size_t>(r)].reset(); }) {}

  std::vector<rank_out> run(const job& j) {
    std::vector<rank_out> out(state_.size());
    pool_.run([&](int r) {
      auto& s = *state_[static_cast<std::size_t>(r)];
      const cudaStream_t stream = s.streams[s.jobs++ % 2];
      if (j.what == algo::native) {
        const auto host = inputs(j.seed, r, j.n);
        sc::device_buffer<float> d(std::span<const float>(host), stream);
        sc::nccl_allreduce(s.comm, d.data(), d.data(), j.n, stream);
        out[static_cast<std::size_t>(r)] = {d.download(), 0};
      } else if (j.one_off) {
        one_off_ring free_functions{s.comm};
        out[static_cast<std::size_t>(r)] = run_job(free_functions, stream, j, r);
      } else {
        out[static_cast<std::size_t>(r)] = run_job(s.ring, stream, j, r);
      }
    });
    return out;
  }

 private:
  struct rank_state {
    rank_state(const ncclUniqueId& id, int rank, int size) : comm(id, rank, size), ring(comm) {}
    sc::communicator comm;
    sc::stream streams[2];
    sc::ring ring;
    std::size_t jobs = 0;
  };
  ncclUniqueId id_;
  std::vector<std::optional<rank_state>> state_;
  rank_pool pool_;  // last: its threads are joined (and the states reset) first
};

/// The element counts every ring is checked with.
std::vector<std::size_t> ring_sizes(int ranks) {
  const auto r = static_cast<std::size_t>(ranks);
  return {0, 1, r - 1, r, 1000003, std::size_t{1} << 22};
}

/// Plain-ring jobs: every size with the default column, a small odd column (many columns,
/// so scratch reuse and the column loop are exercised), and the mean.
std::vector<job> plain_jobs(int ranks, std::uint64_t seed) {
  std::vector<job> jobs;
  for (const std::size_t n : ring_sizes(ranks))
    jobs.push_back({algo::plain, reduce_op::sum, n, sc::ring::default_chunk_floats, seed++});
  for (const std::size_t n : {std::size_t{1}, static_cast<std::size_t>(ranks), std::size_t{100003}})
    jobs.push_back({algo::plain, reduce_op::sum, n, 4099, seed++});
  jobs.push_back({algo::plain, reduce_op::mean, 1000003, sc::ring::default_chunk_floats, seed++});
  jobs.push_back({algo::plain, reduce_op::mean, 100003, 4099, seed++});
  return jobs;
}

/// Compressed jobs for each codec: small sizes, the CPU's default chunk, and a chunk of 1000
/// (not a multiple of any block size, so quantisation blocks restart mid-block).
std::vector<job> compressed_jobs(int ranks, std::uint64_t seed) {
  std::vector<job> jobs;
  const auto r = static_cast<std::size_t>(ranks);
  for (const algo a : {algo::fp16, algo::int8_256, algo::int8_64}) {
    for (const std::size_t n : {std::size_t{0}, std::size_t{1}, r - 1, r, std::size_t{1000003}})
      jobs.push_back({a, reduce_op::sum, n, compress::default_chunk_floats, seed++});
    jobs.push_back({a, reduce_op::sum, 100003, 1000, seed++});
    jobs.push_back({a, reduce_op::mean, 100003, 1000, seed++});
  }
  return jobs;
}

}  // namespace

TEST_CASE("cuda ring: device codecs send the CPU codecs' message sizes", "[cuda][nccl]") {
  // Host-only: runs without a GPU.
  static_assert(sc::device_codec<sc::fp16>);
  static_assert(sc::device_codec<sc::int8_block<256>>);
  static_assert(sc::device_codec<sc::int8_block<64>>);
  static_assert(!sc::device_codec<sc::topk>, "topk's size is only a bound: not a ring codec");
  for (const std::size_t n : {0, 1, 63, 64, 65, 255, 256, 257, 1000, 262144, 1000003}) {
    CAPTURE(n);
    CHECK(sc::fp16::encoded_bytes(n) == compress::fp16::max_encoded_bytes(n));
    CHECK(sc::int8_block<256>::encoded_bytes(n) == compress::int8_block<256>::max_encoded_bytes(n));
    CHECK(sc::int8_block<64>::encoded_bytes(n) == compress::int8_block<64>::max_encoded_bytes(n));
  }
}

TEST_CASE("cuda ring: null data is refused before any CUDA call", "[cuda][nccl]") {
  // Host-only: runs without a GPU. The entry points need a communicator (so a GPU); the check
  // they all start with does not touch CUDA, so it is run directly here.
  try {
    sc::detail::check_ring_data("cuda::ring::allreduce", nullptr, 5, 0);
    FAIL("no strata::error for null data with n = 5");
  } catch (const strata::error& e) {
    CAPTURE(e.what());
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()).find("cuda::ring::allreduce: data is null but n = 5") !=
          std::string::npos);
  }
  CHECK_NOTHROW(sc::detail::check_ring_data("cuda::ring::allreduce", nullptr, 0, 0));
}

TEST_CASE("cuda ring: bad arguments raise strata::error before any transfer", "[cuda][nccl]") {
  if (skip_without_gpu()) return;
  STRATA_CHECK(cudaSetDevice(0));
  sc::stream s;
  ncclUniqueId id = sc::make_unique_id();
  sc::communicator comm(id, 0, 1);
  sc::ring ring(comm);
  const auto expect_error = [](auto&& call, const std::string& part) {
    try {
      call();
      FAIL("no strata::error thrown; expected one saying: " << part);
    } catch (const strata::error& e) {
      CAPTURE(e.what());
      CHECK(e.code() == errc::invalid_argument);
      CHECK(std::string(e.what()).find(part) != std::string::npos);
    }
  };
  // Null data with n > 0: refused before the one-rank shortcut, on every entry point.
  expect_error([&] { ring.allreduce(nullptr, 5, s); }, "data is null but n = 5");
  expect_error([&] { ring.compressed_allreduce<sc::fp16>(nullptr, 5, s); }, "data is null");
  expect_error([&] { sc::ring_allreduce(comm, nullptr, 5, s); }, "cuda::ring::allreduce");
  expect_error([&] { sc::compressed_ring_allreduce<sc::int8_block<>>(comm, nullptr, 7, s); },
               "cuda::ring::compressed_allreduce");
  // Host memory, pinned or not, is not device memory.
  std::vector<float> host(16, 1.0f);
  expect_error([&] { ring.allreduce(host.data(), host.size(), s); }, "not device memory");
  sc::pinned_buffer<float> pinned(16);
  expect_error([&] { ring.allreduce(pinned.data(), 16, s); }, "pinned host memory");
  sc::device_buffer<float> d(16, s);
  expect_error([&] { ring.allreduce(d.data(), 16, s, reduce_op::sum, 0); },
               "chunk_floats must be at least 1");
  // n = 0 needs no buffer at all.
  CHECK_NOTHROW(ring.allreduce(nullptr, 0, s));
  CHECK_NOTHROW(sc::compressed_ring_allreduce<sc::fp16>(comm, nullptr, 0, s));
  // A moved-from communicator.
  sc::communicator moved(std::move(comm));
  expect_error([&] { sc::ring r(comm); }, "moved from");
  if (sc::device_count() >= 2) {  // buffers and current device must be the communicator's
    STRATA_CHECK(cudaSetDevice(1));
    {
      sc::stream s1;
      sc::device_buffer<float> elsewhere(16, s1);
      s1.synchronize();
      STRATA_CHECK(cudaSetDevice(0));
      sc::ring r(moved);
      expect_error([&] { r.allreduce(elsewhere.data(), 16, s); }, "is on device 1");
      STRATA_CHECK(cudaSetDevice(1));
      expect_error([&] { r.allreduce(d.data(), 16, s); }, "current device is 1");
    }
    STRATA_CHECK(cudaSetDevice(0));
  }
  s.synchronize();
}

TEST_CASE("cuda ring: one rank leaves the data as it is", "[cuda][nccl]") {
  if (skip_without_gpu()) return;
  STRATA_CHECK(cudaSetDevice(0));
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  sc::stream s;
  ncclUniqueId id = sc::make_unique_id();
  sc::communicator comm(id, 0, 1);
  sc::ring ring(comm);
  CHECK(ring.rank() == 0);
  CHECK(ring.size() == 1);
  CHECK(ring.device() == 0);
  const std::size_t n = 1000003;
  const auto x = inputs(seed, 0, n);
  sc::device_buffer<float> d(std::span<const float>(x), s);
  ring.allreduce(d.data(), n, s);
  ring.allreduce(d.data(), n, s, reduce_op::mean);
  ring.compressed_allreduce<sc::fp16>(d.data(), n, s);
  ring.compressed_allreduce<sc::int8_block<256>>(d.data(), n, s, reduce_op::mean);
  sc::ring_allreduce(comm, d.data(), n, s);
  sc::compressed_ring_allreduce<sc::int8_block<64>>(comm, d.data(), n, s);
  cuda_test::require_bits_equal(d.download(), x);
  CHECK(ring.bytes_sent() == 0);
  // As the CPU collectives: one rank leaves the values untouched (the codec is not used).
  auto cpu = x;
  strata::comm::thread_world(1).run([&](strata::comm::thread_transport& t) {
    compress::int8_block<256> codec;
    compress::compressed_allreduce(t, std::span(cpu), codec);
  });
  cuda_test::require_bits_equal(cpu, x);
}

TEST_CASE("cuda ring: the ring's schedule and kernels on one GPU equal the CPU ring bitwise",
          "[cuda][nccl]") {
  if (skip_without_gpu()) return;
  STRATA_CHECK(cudaSetDevice(0));
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  for (const int ranks : {2, 3, 5, 8}) {
    CAPTURE(ranks);
    simulated_ranks sim(ranks);
    for (const job& j : plain_jobs(ranks, seed))
      check_job(j, ranks, sim.run(j));
  }
}

TEST_CASE(
    "cuda ring: the compressed ring's schedule and codecs on one GPU equal "
    "compress::compressed_allreduce bitwise",
    "[cuda][nccl]") {
  if (skip_without_gpu()) return;
  STRATA_CHECK(cudaSetDevice(0));
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed);
  for (const int ranks : {2, 3, 5}) {
    CAPTURE(ranks);
    simulated_ranks sim(ranks);
    for (const job& j : compressed_jobs(ranks, seed))
      check_job(j, ranks, sim.run(j));
  }
}

TEST_CASE(
    "cuda ring: over NCCL on every GPU it equals the CPU ring bitwise and ncclAllReduce within "
    "tolerance",
    "[cuda][nccl]") {
  if (skip_without_gpus(2)) return;
  const int ranks = std::min(sc::device_count(), 8);
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed, ranks);
  nccl_ranks gpus(ranks);
  for (const job& j : plain_jobs(ranks, seed))
    check_job(j, ranks, gpus.run(j));
  // strata's ring and NCCL's allreduce of the same inputs: each within 1e-5 · Σ|x| of the
  // exact sum, so within 2e-5 · Σ|x| of each other.
  for (const std::size_t n : {std::size_t{1000003}, std::size_t{1} << 22}) {
    const job mine{algo::plain, reduce_op::sum, n, sc::ring::default_chunk_floats, seed + 1000};
    job theirs = mine;
    theirs.what = algo::native;
    const auto a = gpus.run(mine), b = gpus.run(theirs);
    check_job(mine, ranks, a);
    check_job(theirs, ranks, b);
    const exact_reference ref(mine, ranks);
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(n, r);
      const auto& x = a[static_cast<std::size_t>(r)].values;
      const auto& y = b[static_cast<std::size_t>(r)].values;
      REQUIRE(x.size() == y.size());
      for (std::size_t i = 0; i < n; ++i)
        if (!(std::fabs(double{x[i]} - y[i]) <= 2.0 * ref.bound[i])) {
          CAPTURE(i, x[i], y[i], ref.bound[i]);
          REQUIRE(std::fabs(double{x[i]} - y[i]) <= 2.0 * ref.bound[i]);
        }
    }
  }
  // The one-off entry points (a fresh ring per call) on the same communicators.
  for (const algo a : {algo::plain, algo::int8_256}) {
    job j{a, reduce_op::sum, 100003, 4099, seed + 2000};
    j.one_off = true;
    check_job(j, ranks, gpus.run(j));
  }
}

TEST_CASE(
    "cuda ring: compressed over NCCL on every GPU equals compress::compressed_allreduce bitwise",
    "[cuda][nccl]") {
  if (skip_without_gpus(2)) return;
  const int ranks = std::min(sc::device_count(), 8);
  const std::uint64_t seed = cuda_test::fresh_seed();
  CAPTURE(seed, ranks);
  nccl_ranks gpus(ranks);
  for (const job& j : compressed_jobs(ranks, seed))
    check_job(j, ranks, gpus.run(j));
}

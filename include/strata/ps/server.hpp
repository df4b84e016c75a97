/// @file server.hpp
/// `server<Optimizer, Consistency, PushCodec>`: one parameter-server shard. Holds the rows (and
/// optimizer state) of every table that the shard map assigns to it, answers pulls, applies
/// pushes under a consistency policy, and runs the work on a oneTBB arena. Its code is
/// `server_core<Optimizer, DenseOptimizer>`, which takes the policy and the push codec as
/// run-time values (one copy of the server's code for every policy and codec).
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <span>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

#include "strata/comm/concepts.hpp"
#include "strata/compress/concepts.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/identity.hpp"
#include "strata/core/error.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/row_init.hpp"
#include "strata/core/row_store.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/optim/sparse_gradient.hpp"
#include "strata/ps/consistency.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/protocol.hpp"

namespace strata::ps {

/// Settings of a server.
struct server_options {
  /// Threads of the server's tbb::task_arena (its own threads, exactly this many). With 1 the
  /// thread calling serve() handles every request itself, serially (it borrows no pool).
  int threads = 1;
  uniform_init init{};       ///< initial row values (must match every other storage)
  std::size_t stripes = 64;  ///< lock stripes per table (a power of two)
};

/// A lock stripe's first chunk: a table has `stripes` row stores, most of a few rows when the
/// table is small, so they start at 4 rows and grow (doubling) to 1024-row chunks.
inline constexpr std::size_t stripe_first_chunk_rows = 4;

/// The bytes a server's rows of one table take once it holds `rows` of them, in the
/// `stripes` row stores of its lock stripes (4-row first chunks, growing), each taken as
/// holding rows / stripes of them (the key hash spreads them about evenly):
/// stripes · `row_store::max_bytes`. With rows ≫ 1024 · stripes, about rows ·
/// `row_store::bytes_per_row(dim, state_floats)`. `stripes`: server_options::stripes (64 by
/// default). What ctr_train's start-up check and report use.
[[nodiscard]] constexpr std::uint64_t shard_table_bytes(std::uint64_t rows, std::size_t dim,
                                                        std::size_t state_floats,
                                                        std::size_t stripes = 64) {
  const std::uint64_t per_stripe = (rows + stripes - 1) / stripes;
  return stripes * row_store::max_bytes(per_stripe, dim, state_floats, stripe_first_chunk_rows);
}

/// Load counters of one shard (a snapshot), so a hot shard is visible.
struct shard_stats {
  std::uint64_t pull_requests = 0;
  std::uint64_t push_requests = 0;
  std::uint64_t keys_pulled = 0;  ///< rows sent
  std::uint64_t keys_pushed = 0;  ///< gradient rows received
  std::uint64_t bytes_received = 0;
  std::uint64_t bytes_sent = 0;
  std::uint64_t deferred_pulls = 0;  ///< pulls that had to wait for slower workers
  std::uint64_t max_staleness = 0;   ///< max over pulls of (worker's step − slowest's step)
  std::uint64_t rows = 0;            ///< rows held
};

/// How a server reads pushed gradient rows: the push codec's name and, for a lossy codec, its
/// decoder (type-erased: one server type for every codec; one call per push). Without a
/// decoder the pushes are fp32 (`compress::identity`) and read in place.
struct push_decoding {
  const char* name = compress::identity::name;
  std::function<void(std::span<const std::byte>, std::span<float>)> decode;

  /// The decoding of pushes that `codec` encoded.
  template <compress::compressor Codec>
  [[nodiscard]] static push_decoding of(Codec codec) {
    push_decoding d;
    d.name = Codec::name;
    if constexpr (!std::is_same_v<Codec, compress::identity>)
      d.decode = [codec = std::move(codec)](std::span<const std::byte> bytes,
                                            std::span<float> values) {
        codec.decode(bytes, values);
      };
    return d;
  }
};

/// One parameter-server shard (`server<Optimizer, Consistency, PushCodec, DenseOptimizer>`
/// below is this with the policy and codec given as types).
///
/// Rows live in `stripes` row stores per table (`row_store`, the store of
/// `embedding::hash_table` too: key → slot → the weights followed by
/// `Optimizer::state_floats(dim)` state, in chunks that never move: 4 rows first, doubling to
/// 1024), each under its own mutex, so
/// fixed and unbounded tables both work and requests of many workers run concurrently without
/// races. A row is created on first touch with `uniform_init` values of (seed, table, key), so
/// every placement gives the same table.
///
/// `serve(transport)` receives requests (tag `comm::tags::ps_request`) from every worker,
/// handles each worker's requests in order (different workers concurrently) on a task arena of
/// `server_options::threads` threads (with threads == 1, on serve()'s own thread: no hand-off
/// per request), replies with `comm::tags::ps_reply` (moving the reply buffer into transports
/// with `send_owned`, so an in-process reply is never copied), and returns once every worker
/// has sent a shutdown and all work is done. Consistency:
/// - `sync`: a step's pushes from all W workers are summed in worker-rank order and applied
///   once; pulls for step t are parked until steps < t are applied.
/// - `async`: pushes applied on arrival; pulls never wait.
/// - `bounded<S>`: pushes applied on arrival; a pull for step t is parked while the slowest
///   worker has applied fewer than t − S pushes.
/// A failing request (bad message, foreign key, wrong policy) is answered with an error reply
/// that the worker's client raises; the server keeps serving.
///
/// Optimizers per part: one table (`dense_table`, e.g. a trainer's dense parameters cut into
/// rows) may be updated by `DenseOptimizer` instead of `Optimizer` (its rows then hold
/// `DenseOptimizer::state_floats(dim)` state).
///
/// Thread-safety: `serve` must run on one thread at a time; `stats`, `for_each_row`,
/// `import_row` may be called concurrently with it (they take the stripe locks).
/// Costs: a pull or push is O(keys · dim) plus one flat-index probe per key and one lock per
/// stripe touched (keys grouped by stripe); sync adds a sort of the step's keys.
template <optim::table_optimizer Optimizer,
          optim::sparse_optimizer DenseOptimizer = optim::default_dense_t<Optimizer>>
class server_core {
 public:
  using optimizer_type = Optimizer;
  using dense_optimizer_type = DenseOptimizer;
  /// `dense_table` meaning "no table uses DenseOptimizer".
  static constexpr std::size_t no_dense_table = static_cast<std::size_t>(-1);

  /// The shard of server `server_index` of `map`, under policy `rule`, reading pushes with
  /// `codec`.
  server_core(shard_map map, int server_index, consistency_rule rule, Optimizer optimizer = {},
              server_options options = {}, push_decoding codec = {})
      : server_core(std::move(map), server_index, rule, optimizer, {}, no_dense_table, options,
                    std::move(codec)) {}

  /// As above, with table `dense_table` of `map` updated by `dense_optimizer`.
  server_core(shard_map map, int server_index, consistency_rule rule, Optimizer optimizer,
              DenseOptimizer dense_optimizer, std::size_t dense_table, server_options options = {},
              push_decoding codec = {})
      : map_(std::move(map)),
        index_(server_index),
        rule_(rule),
        optimizer_(optimizer),
        dense_optimizer_(dense_optimizer),
        dense_table_(dense_table),
        options_(options),
        codec_(std::move(codec)) {
    check_rule(rule_, "ps::server");
    STRATA_EXPECTS(dense_table == no_dense_table || dense_table < map_.table_count(),
                   "ps::server: dense_table ", dense_table, " outside the map's ",
                   map_.table_count(), " tables");
    STRATA_EXPECTS(server_index >= 0 && server_index < map_.roles().servers(),
                   "ps::server: server index ", server_index, " outside [0, ",
                   map_.roles().servers(), ")");
    STRATA_EXPECTS(options_.threads >= 1, "ps::server: threads must be ≥ 1, got ",
                   options_.threads);
    STRATA_EXPECTS(options_.stripes >= 1 && std::has_single_bit(options_.stripes),
                   "ps::server: stripes must be a power of two, got ", options_.stripes);
    const auto workers = static_cast<std::size_t>(map_.roles().workers());
    tables_.reserve(map_.table_count());
    for (std::size_t t = 0; t < map_.table_count(); ++t) {
      auto tab = std::make_unique<table_state>();
      tab->dim = map_.spec(t).dim;
      tab->state_floats = t == dense_table_ ? DenseOptimizer::state_floats(tab->dim)
                                            : Optimizer::state_floats(tab->dim);
      tab->row_floats = tab->dim + tab->state_floats;
      for (std::size_t s = 0; s < options_.stripes; ++s)
        tab->stripes.emplace_back(tab->dim, tab->state_floats);
      tab->received.assign(workers, 0);
      tab->applied.assign(workers, 0);
      tables_.push_back(std::move(tab));
    }
    queues_.resize(workers);
  }

  server_core(const server_core&) = delete;
  server_core& operator=(const server_core&) = delete;

  /// The consistency policy this server acts on.
  [[nodiscard]] const consistency_rule& rule() const noexcept { return rule_; }

  [[nodiscard]] const shard_map& map() const noexcept { return map_; }
  [[nodiscard]] int index() const noexcept { return index_; }

  /// Serves requests on `t` (whose rank must be this server's rank) until every worker has
  /// shut down. Rethrows transport failures (timeout, aborted).
  template <comm::transport T>
  void serve(T& t) {
    const layout& roles = map_.roles();
    roles.check_size(t.size());
    STRATA_EXPECTS(t.rank() == roles.server_rank(index_), "ps::server::serve: server ", index_,
                   " runs on rank ", roles.server_rank(index_), ", not on rank ", t.rank());
    // The arena's slots are all reserved for the server's own threads, so the thread count is
    // exactly `threads` whatever oneTBB's global worker limit, and work is handed over through
    // the server's own (instrumented, TSan-visible) queue rather than pooled tbb tasks.
    // With one thread, the receiving thread does the work itself: no hand-off, no wake-up of
    // a second thread per request (which dominates small requests), the same order.
    inline_ = options_.threads == 1;
    tbb::task_arena arena(options_.threads, static_cast<unsigned>(options_.threads));
    {
      std::lock_guard lock(done_mutex_);
      stopping_ = false;
    }
    serve_failed_.store(false);
    std::vector<std::thread> pool;
    pool.reserve(static_cast<std::size_t>(options_.threads));
    for (int i = 0; !inline_ && i < options_.threads; ++i)
      pool.emplace_back([this, &arena] { arena.execute([this] { work_loop(); }); });
    const int workers = roles.workers();
    int shutdowns = 0;
    std::exception_ptr failure;
    try {
      while (shutdowns < workers) {
        comm::message m = t.recv_any(comm::tags::ps_request);
        bytes_received_.fetch_add(m.bytes.size(), std::memory_order_relaxed);
        if (!roles.is_worker(m.source)) {
          std::vector<std::byte> reply;
          encode_error(reply, 0, msg_type::pull_request, 0, 0, errc::bad_message,
                       cat("ps server ", index_, ": rank ", m.source,
                           " sent a request but is not a worker (", roles.describe(), ")"));
          send(t, m.source, std::move(reply));
          continue;
        }
        if (m.bytes.size() >= header_bytes &&
            static_cast<std::uint8_t>(m.bytes[6]) == static_cast<std::uint8_t>(msg_type::shutdown))
          ++shutdowns;
        if (inline_)
          handle_reporting(t, roles.worker_index(m.source), m.bytes);
        else
          enqueue(t, roles.worker_index(m.source), std::move(m.bytes));
      }
    } catch (...) {
      failure = std::current_exception();
    }
    {
      std::unique_lock lock(done_mutex_);
      done_.wait(lock, [&] { return outstanding_ == 0; });
      stopping_ = true;
    }
    jobs_ready_.notify_all();
    for (auto& thread : pool)
      thread.join();
    if (failure) {
      // In-process readers waiting for a step this server will never apply end now (aborted),
      // not at their timeout.
      serve_failed_.store(true);
      for (auto& tab : tables_) {
        std::lock_guard lock(tab->mutex);
        tab->applied_cv.notify_all();
      }
      std::rethrow_exception(failure);
    }
    if (task_failure_) std::rethrow_exception(std::exchange(task_failure_, nullptr));
  }

  /// Snapshot of the load counters.
  [[nodiscard]] shard_stats stats() const {
    shard_stats s;
    s.pull_requests = pull_requests_.load();
    s.push_requests = push_requests_.load();
    s.keys_pulled = keys_pulled_.load();
    s.keys_pushed = keys_pushed_.load();
    s.bytes_received = bytes_received_.load();
    s.bytes_sent = bytes_sent_.load();
    s.deferred_pulls = deferred_pulls_.load();
    s.max_staleness = max_staleness_.load();
    for (std::size_t t = 0; t < tables_.size(); ++t)
      s.rows += rows(t);
    return s;
  }
  /// In-process pull, without messages (a worker in the same process as this server): waits
  /// until worker `worker`'s pull of `table` for `step` may be served — under the policy's
  /// rule, and after this worker's own earlier pushes are applied, as the message path
  /// serves it — then calls fn(i, row) for every keys[i] (row created on first touch) under
  /// the stripe locks. `step` is the number of pushes the worker has made to the table.
  /// Raises errc::timeout when the step is not servable within `timeout_seconds`.
  template <class Fn>
  void read_rows(int worker, std::size_t table, std::uint64_t step,
                 std::span<const std::uint64_t> keys, double timeout_seconds, Fn&& fn) {
    map_.check_table(table, "ps::server::read_rows");
    STRATA_EXPECTS(worker >= 0 && worker < map_.roles().workers(), "ps::server::read_rows: worker ",
                   worker, " outside the ", map_.roles().workers(), " workers");
    table_state& tab = *tables_[table];
    const auto servable = [&] {
      if (rule_.aggregates_step) return tab.applied_steps >= step;
      return tab.applied[static_cast<std::size_t>(worker)] >= step && ready(tab, step);
    };
    {
      std::unique_lock lock(tab.mutex);
      if (!servable()) {
        deferred_pulls_.fetch_add(1, std::memory_order_relaxed);
        const bool ready_now =
            tab.applied_cv.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                                    [&] { return servable() || serve_failed_.load(); });
        if (ready_now && !servable())
          fail(errc::aborted, cat("ps::server::read_rows: server ", index_,
                                  " stopped serving (its rank failed or the world is stopping) "
                                  "while worker ",
                                  worker, " waited for table ", table, " at step ", step));
        if (!ready_now)
          fail(errc::timeout,
               cat("ps::server::read_rows: worker ", worker, "'s pull of table ", table,
                   " for step ", step, " was not servable within ", timeout_seconds, " s under ",
                   rule_.name, " (did a worker stop pushing?)"));
      }
      note_staleness(tab, step);
    }
    for_each_key_row(tab, table, keys, [&](std::size_t i, const float* row) { fn(i, row); });
    pull_requests_.fetch_add(1, std::memory_order_relaxed);
    keys_pulled_.fetch_add(keys.size(), std::memory_order_relaxed);
  }

  /// Largest observed staleness (see `shard_stats::max_staleness`); ≤ the policy's bound.
  [[nodiscard]] std::uint64_t observed_staleness() const noexcept { return max_staleness_.load(); }

  /// Restarts the step clocks (every worker back at step 0) while keeping all rows and
  /// optimizer state, so a new round of clients can start after serve() returned (the trainer
  /// runs in segments between checkpoints). Call only while the server is not serving.
  void reset_clock() {
    for (auto& tab : tables_) {
      std::lock_guard lock(tab->mutex);
      std::fill(tab->received.begin(), tab->received.end(), 0);
      std::fill(tab->applied.begin(), tab->applied.end(), 0);
      tab->applied_steps = 0;
      tab->pending.clear();
      tab->parked.clear();
    }
  }

  /// Rows of table t held by this shard.
  [[nodiscard]] std::size_t rows(std::size_t t) const {
    map_.check_table(t, "ps::server::rows");
    return sum_over_stripes(t, [](const auto& store) { return store.size(); });
  }

  /// Bytes of table `t`'s rows on this server (`row_store::bytes` of its stripes: index, keys
  /// and chunks). Takes the stripe locks.
  [[nodiscard]] std::size_t bytes(std::size_t t) const {
    map_.check_table(t, "ps::server::bytes");
    return sum_over_stripes(t, [](const auto& store) { return store.bytes(); });
  }

  /// Checkpoint export: calls `fn(table, key, weights, state)` for every row held (keys in no
  /// particular order), holding that row's stripe lock during the call.
  template <class Fn>
  void for_each_row(Fn&& fn) const {
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const table_state& tab = *tables_[t];
      for (std::size_t s = 0; s < options_.stripes; ++s) {
        auto& st = tab.stripes[s];
        std::lock_guard lock(st.mutex);
        st.rows.for_each([&](std::uint64_t key, std::span<const float> weights,
                             std::span<const float> state) { fn(t, key, weights, state); });
      }
    }
  }

  /// Checkpoint import: sets row `key` of table t (creating it) to `weights` and `state`.
  /// Raises `errc::size_mismatch` for wrong sizes, `errc::out_of_range` for a key outside a
  /// fixed table, `errc::invalid_argument` for a key this shard does not own.
  void import_row(std::size_t t, std::uint64_t key, std::span<const float> weights,
                  std::span<const float> state) {
    map_.check_keys(t, std::span(&key, 1), "ps::server::import_row");
    table_state& tab = *tables_[t];
    if (weights.size() != tab.dim || state.size() != tab.state_floats)
      fail(errc::size_mismatch,
           cat("ps::server::import_row: table ", t, " rows have ", tab.dim, " weights and ",
               tab.state_floats, " state floats, got ", weights.size(), " and ", state.size()));
    STRATA_EXPECTS(map_.server_of(t, key) == static_cast<std::size_t>(index_),
                   "ps::server::import_row: key ", key, " of table ", t, " belongs to server ",
                   map_.server_of(t, key), ", not to server ", index_);
    auto& st = stripe_of(tab, key);
    std::lock_guard lock(st.mutex);
    float* row = st.rows.data(slot_of(st, t, key));
    std::copy(weights.begin(), weights.end(), row);
    std::copy(state.begin(), state.end(), row + tab.dim);
  }

 private:
  /// Σ over table t's stripes of `count(stripe's row store)`, each under its stripe lock.
  template <class Count>
  [[nodiscard]] std::size_t sum_over_stripes(std::size_t t, Count&& count) const {
    std::size_t n = 0;
    for (std::size_t s = 0; s < options_.stripes; ++s) {
      auto& st = tables_[t]->stripes[s];
      std::lock_guard lock(st.mutex);
      n += count(st.rows);
    }
    return n;
  }
  struct stripe {
    stripe(std::size_t dim, std::size_t state_floats)
        : rows(dim, state_floats, stripe_first_chunk_rows) {}
    mutable std::mutex mutex;
    row_store rows;  // key → slot → weights, then optimizer state (guarded by `mutex`)
  };
  struct parked_pull {
    int worker = 0;
    std::uint64_t step = 0;
    wire_codec codec = wire_codec::fp32;
    std::vector<std::uint64_t> keys;
  };
  /// A push's gradient rows: fp32 rows are read where they arrived, in the request message
  /// (kept alive here: no decoded copy); compressed rows are decoded into `decoded`.
  struct push_grads {
    std::vector<std::byte> message;
    std::vector<float> decoded;
    std::span<const float> values;
  };
  struct sync_step {
    std::vector<std::vector<std::uint64_t>> keys;  // per worker
    std::vector<push_grads> grads;                 // per worker
    std::vector<char> arrived;
    int count = 0;
  };
  /// Where the rows of one key list live: keys grouped by stripe (`bounds`, `order` as in
  /// for_each_key_row) and each grouped key's slot in its stripe.
  struct key_plan {
    std::vector<std::uint64_t> keys;
    std::vector<std::uint32_t> bounds, order, slots;
  };
  struct table_state {
    std::size_t dim = 0, state_floats = 0, row_floats = 0;
    std::deque<stripe> stripes;  // `server_options::stripes` (a deque: a stripe never moves)
    std::mutex mutex;            // guards everything below
    std::vector<std::uint64_t> received;  // requests seen per worker: pushes (= its step)
    std::vector<std::uint64_t> applied;   // pushes applied per worker (async / bounded)
    std::uint64_t applied_steps = 0;      // sync: steps applied
    std::condition_variable applied_cv;   // notified whenever pushes were applied
    bool applying = false;                // sync: one step being applied
    std::map<std::uint64_t, sync_step> pending;
    std::vector<parked_pull> parked;
    // sync: the step being applied (used by one thread at a time: `applying`)
    std::vector<std::uint64_t> step_keys;
    std::vector<float> step_grads;
    optim::sparse_gradient summed;
    // The dense table's pushes and pulls carry the same keys every step: their stripe grouping
    // and row slots, resolved once (slots are stable: rows are never removed).
    std::mutex plan_mutex;
    std::shared_ptr<const key_plan> plan;
  };

  std::size_t stripe_index(std::uint64_t key) const noexcept {
    return mix_ids(key, 0x57A1Eull) & (options_.stripes - 1);
  }
  stripe& stripe_of(table_state& tab, std::uint64_t key) const noexcept {
    return tab.stripes[stripe_index(key)];
  }

  /// Calls `fn(i, row)` for every keys[i] (row created on first touch), taking each stripe's
  /// lock once: the keys are grouped by stripe with a counting sort, so a request of n keys
  /// costs ≤ `stripes` lock round trips instead of n (plus two scratch arrays per request).
  template <class Fn>
  void for_each_key_row(table_state& tab, std::size_t table, std::span<const std::uint64_t> keys,
                        Fn&& fn) {
    if (table == dense_table_) {
      for_each_planned_row(tab, table, keys, fn, false);
      return;
    }
    std::vector<std::uint32_t> bounds, order;
    for_each_key_row_grouped(tab, table, keys, bounds, order,
                             [&](std::size_t i, float* row, std::uint32_t) { fn(i, row); });
  }
  /// for_each_key_row through the table's cached key plan (built on first use, or again when
  /// the keys differ from the plan's): no grouping and no index probe per key. `parallel`:
  /// the stripes of a large key list run as oneTBB tasks (in the calling thread's arena), so
  /// fn must be safe to call for different keys at once.
  template <class Fn>
  void for_each_planned_row(table_state& tab, std::size_t table,
                            std::span<const std::uint64_t> keys, Fn& fn, bool parallel) {
    if (keys.empty()) return;
    std::shared_ptr<const key_plan> plan;
    {
      std::lock_guard lock(tab.plan_mutex);
      plan = tab.plan;
    }
    if (!plan || !std::equal(keys.begin(), keys.end(), plan->keys.begin(), plan->keys.end())) {
      auto fresh = std::make_shared<key_plan>();
      fresh->keys.assign(keys.begin(), keys.end());
      fresh->slots.resize(keys.size());
      std::size_t j = 0;
      for_each_key_row_grouped(tab, table, keys, fresh->bounds, fresh->order,
                               [&](std::size_t i, float* row, std::uint32_t slot) {
                                 fresh->slots[j++] = slot;
                                 fn(i, row);
                               });
      std::lock_guard lock(tab.plan_mutex);
      tab.plan = std::move(fresh);
      return;
    }
    const key_plan& p = *plan;
    const auto stripe_rows = [&](std::size_t s) {
      const std::uint32_t first = s == 0 ? 0 : p.bounds[s - 1];
      if (first == p.bounds[s]) return;
      auto& st = tab.stripes[s];
      std::lock_guard lock(st.mutex);
      for (std::uint32_t j = first; j < p.bounds[s]; ++j)
        fn(p.order[j], st.rows.data(p.slots[j]));
    };
    if (parallel && keys.size() * tab.row_floats >= parallel_apply_floats) {
      tbb::parallel_for(tbb::blocked_range<std::size_t>(0, options_.stripes),
                        [&](const tbb::blocked_range<std::size_t>& r) {
                          for (std::size_t s = r.begin(); s < r.end(); ++s)
                            stripe_rows(s);
                        });
    } else {
      for (std::size_t s = 0; s < options_.stripes; ++s)
        stripe_rows(s);
    }
  }
  /// Floats of rows and state above which the dense table's update runs its stripes in
  /// parallel (a oneTBB dispatch costs microseconds; 2^16 floats of Adagrad ≈ 50 µs).
  static constexpr std::size_t parallel_apply_floats = std::size_t{1} << 16;
  /// The grouping of for_each_key_row, keeping `bounds` and `order` and passing each row's
  /// slot: fn(i, row, slot) in grouped order.
  template <class Fn>
  void for_each_key_row_grouped(table_state& tab, std::size_t table,
                                std::span<const std::uint64_t> keys,
                                std::vector<std::uint32_t>& bounds,
                                std::vector<std::uint32_t>& order, Fn&& fn) {
    const std::size_t stripes = options_.stripes, n = keys.size();
    // bounds[s + 1] ← keys in stripe s; prefix sums make bounds[s] the first position of s;
    // placing advances bounds[s] to the end of stripe s.
    bounds.assign(stripes + 1, 0);
    order.resize(n);
    for (const std::uint64_t key : keys)
      ++bounds[stripe_index(key) + 1];
    for (std::size_t s = 0; s < stripes; ++s)
      bounds[s + 1] += bounds[s];
    for (std::size_t i = 0; i < n; ++i)
      order[bounds[stripe_index(keys[i])]++] = static_cast<std::uint32_t>(i);
    std::uint32_t first = 0;
    for (std::size_t s = 0; s < stripes; first = bounds[s], ++s) {
      if (first == bounds[s]) continue;
      auto& st = tab.stripes[s];
      std::lock_guard lock(st.mutex);
      for (std::uint32_t j = first; j < bounds[s]; ++j) {
        const std::uint64_t slot = slot_of(st, table, keys[order[j]]);
        fn(order[j], st.rows.data(slot), static_cast<std::uint32_t>(slot));
      }
    }
    bounds.erase(bounds.begin() + static_cast<std::ptrdiff_t>(stripes), bounds.end());
  }
  /// The slot of `key` in stripe `st` of table t, its row created on first touch; the stripe
  /// lock must be held.
  std::uint64_t slot_of(stripe& st, std::size_t t, std::uint64_t key) {
    return st.rows.find_or_create(key, options_.init, t).first;
  }

  /// Sends a reply; moves the buffer into transports that can take it (`send_owned`).
  template <comm::transport T>
  void send(T& t, int rank, std::vector<std::byte>&& bytes) {
    const std::size_t size = bytes.size();
    std::lock_guard lock(send_mutex_);
    comm::send_moving(t, rank, comm::tags::ps_reply, bytes);
    bytes_sent_.fetch_add(size, std::memory_order_relaxed);
  }

  /// Queues `fn` for the server's threads (runs it at once when the server works inline).
  void spawn(std::function<void()> fn) {
    if (inline_) {
      fn();  // fn reports its own failures; a failing transport propagates to serve()
      return;
    }
    {
      std::lock_guard lock(done_mutex_);
      ++outstanding_;
      jobs_.push_back(std::move(fn));
    }
    jobs_ready_.notify_one();
  }

  /// Body of each server thread (inside the arena): runs queued jobs until serve() stops.
  void work_loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(done_mutex_);
        jobs_ready_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      try {
        job();
      } catch (...) {  // only a failing transport gets here; serve() rethrows it
        std::lock_guard lock(done_mutex_);
        if (!task_failure_) task_failure_ = std::current_exception();
      }
      std::lock_guard lock(done_mutex_);
      if (--outstanding_ == 0) done_.notify_all();
    }
  }

  template <comm::transport T>
  void enqueue(T& t, int worker, std::vector<std::byte> bytes) {
    std::lock_guard lock(queue_mutex_);
    auto& q = queues_[static_cast<std::size_t>(worker)];
    q.pending.push_back(std::move(bytes));
    if (q.running) return;
    q.running = true;
    spawn([this, &t, worker] { drain(t, worker); });
  }

  template <comm::transport T>
  void drain(T& t, int worker) {
    auto& q = queues_[static_cast<std::size_t>(worker)];
    for (;;) {
      std::vector<std::byte> bytes;
      {
        std::lock_guard lock(queue_mutex_);
        if (q.pending.empty()) {
          q.running = false;
          return;
        }
        bytes = std::move(q.pending.front());
        q.pending.pop_front();
      }
      handle_reporting(t, worker, bytes);
      comm::recycle(t, std::move(bytes));  // a request not kept by a step (empty if it was)
    }
  }

  /// Runs `handle`, turning any failure into an error reply to the worker.
  template <comm::transport T>
  void handle_reporting(T& t, int worker, std::vector<std::byte>& bytes) {
    // The failed request's type as sent (even if it does not decode), so the client can tell
    // which of its requests the error answers.
    msg_type type = msg_type::pull_request;
    if (bytes.size() >= header_bytes) {
      const auto raw = static_cast<std::uint8_t>(bytes[6]);
      if (raw >= 1 && raw <= msg_type_last) type = static_cast<msg_type>(raw);
    }
    std::uint32_t table = 0;
    std::uint64_t step = 0;
    errc code = errc::internal;
    std::string text;
    try {
      handle(t, worker, bytes, type, table, step);
      return;
    } catch (const error& e) {
      code = e.code();
      text = e.what();
    } catch (const std::bad_alloc&) {
      code = errc::out_of_memory;
      text = out_of_memory_text(table);
    } catch (const std::exception& e) {
      text = e.what();
    }
    std::vector<std::byte> reply;
    encode_error(
        reply, static_cast<std::uint32_t>(worker), type, table, step, code,
        cat("ps server ", index_, " (rank ", map_.roles().server_rank(index_), "): ", text));
    send(t, map_.roles().worker_rank(worker), std::move(reply));
  }

  /// What a request that ran out of memory tells its worker: the table, the rows and bytes
  /// this server holds, and what to do (a fixed sentence if even that cannot be allocated).
  std::string out_of_memory_text(std::uint32_t table) const {
    try {
      std::size_t rows_held = 0, bytes_held = 0;
      for (std::size_t t = 0; t < tables_.size(); ++t) {
        rows_held += rows(t);
        bytes_held += bytes(t);
      }
      const bool known = table < map_.table_count();
      return cat("out of memory serving table ", known ? map_.spec(table).name : std::string("?"),
                 " (", table, "), of which it holds ", known ? rows(table) : 0,
                 " rows; this server holds ", rows_held, " rows of every table in ",
                 bytes_held >> 20,
                 " MiB. The tables do not fit the memory this server process may use (its "
                 "address-space or data limit, or the machine's memory): run more server "
                 "processes (--servers), give each more memory, or lower the table rows");
    } catch (...) {
      return "out of memory (and too little left to describe it); run more server processes";
    }
  }

  /// Keys must be owned by this shard.
  void check_owned(std::size_t t, std::span<const std::uint64_t> keys) const {
    for (const std::uint64_t key : keys)
      if (map_.server_of(t, key) != static_cast<std::size_t>(index_))
        fail(errc::bad_message, cat("ps protocol: key ", key, " of table ", t,
                                    " belongs to server ", map_.server_of(t, key), ", not to ",
                                    index_, "; do client and server use the same shard map?"));
  }

  template <comm::transport T>
  void handle(T& t, int worker, std::vector<std::byte>& bytes, msg_type& type, std::uint32_t& table,
              std::uint64_t& step) {
    request r = decode_request(bytes, map_, rule_.code, worker);
    type = r.h.type;
    table = r.h.table;
    step = r.h.step;
    if (r.h.type == msg_type::shutdown) {
      header ack;
      ack.type = msg_type::shutdown_ack;
      ack.worker = r.h.worker;
      std::vector<std::byte> reply;
      start_message(reply, ack);
      send(t, map_.roles().worker_rank(worker), std::move(reply));
      return;
    }
    check_owned(r.h.table, r.keys);
    if (r.h.type == msg_type::pull_request)
      handle_pull(t, worker, r);
    else
      handle_push(t, worker, r, bytes);
  }

  /// Whether a pull for `step` may be served now (table mutex held).
  [[nodiscard]] bool ready(const table_state& tab, std::uint64_t step) const noexcept {
    if (rule_.aggregates_step) return tab.applied_steps >= step;
    if (!rule_.blocks_on_step) return true;
    const std::uint64_t slowest = *std::min_element(tab.applied.begin(), tab.applied.end());
    return step <= slowest + rule_.max_staleness;
  }
  /// Records the staleness of a pull being served (table mutex held).
  void note_staleness(const table_state& tab, std::uint64_t step) noexcept {
    const std::uint64_t slowest = rule_.aggregates_step
                                      ? tab.applied_steps
                                      : *std::min_element(tab.applied.begin(), tab.applied.end());
    const std::uint64_t stale = step > slowest ? step - slowest : 0;
    std::uint64_t seen = max_staleness_.load();
    while (stale > seen && !max_staleness_.compare_exchange_weak(seen, stale)) {
    }
  }

  template <comm::transport T>
  void handle_pull(T& t, int worker, request& r) {
    const header& h = r.h;
    parked_pull pull{worker, h.step, h.codec, std::move(r.keys)};
    table_state& tab = *tables_[h.table];
    {
      std::lock_guard lock(tab.mutex);
      const std::uint64_t expected = tab.received[static_cast<std::size_t>(worker)];
      if (h.step != expected)
        fail(errc::bad_message, cat("ps protocol: pull for step ", h.step, " of table ", h.table,
                                    " but worker ", worker, " has pushed ", expected, " steps"));
      if (!ready(tab, h.step)) {
        deferred_pulls_.fetch_add(1, std::memory_order_relaxed);
        tab.parked.push_back(std::move(pull));
        return;
      }
      note_staleness(tab, h.step);
    }
    reply_pull(t, h.table, pull);
  }

  template <comm::transport T>
  void reply_pull(T& t, std::size_t table, const parked_pull& pull) {
    table_state& tab = *tables_[table];
    const std::size_t n = pull.keys.size(), dim = tab.dim;
    header h;
    h.type = msg_type::pull_reply;
    h.codec = pull.codec;
    h.worker = static_cast<std::uint32_t>(pull.worker);
    h.table = static_cast<std::uint32_t>(table);
    h.step = pull.step;
    h.key_count = n;
    h.dim = static_cast<std::uint32_t>(dim);
    h.policy = rule_.code;
    h.payload_bytes = n * dim * value_bytes(pull.codec);
    std::vector<std::byte> reply = comm::take_recycled(t, header_bytes + h.payload_bytes);
    const auto payload = start_message(reply, h);
    std::vector<float> staged(pull.codec == wire_codec::fp16 ? dim : 0);
    const compress::fp16 half;
    for_each_key_row(tab, table, pull.keys, [&](std::size_t i, const float* row) {
      if (pull.codec == wire_codec::fp32) {
        std::memcpy(payload.data() + i * dim * 4, row, dim * 4);
      } else {
        std::copy(row, row + dim, staged.begin());
        half.encode(staged, payload.subspan(i * dim * 2, dim * 2));
      }
    });
    pull_requests_.fetch_add(1, std::memory_order_relaxed);
    keys_pulled_.fetch_add(n, std::memory_order_relaxed);
    send(t, map_.roles().worker_rank(pull.worker), std::move(reply));
  }

  template <comm::transport T>
  void handle_push(T& t, int worker, request& r, std::vector<std::byte>& message) {
    const header& h = r.h;
    std::vector<std::uint64_t> keys = std::move(r.keys);
    push_grads grads;
    const std::size_t values = keys.size() * h.dim;
    if (!codec_.decode) {
      if (h.codec != wire_codec::fp32)
        fail(errc::bad_message, cat("ps protocol: push codec ", static_cast<int>(h.codec),
                                    " but this server expects fp32 gradients"));
      // The rows are read in place (the message moves into the step) when they are aligned
      // as floats — they are, after the 48-byte header and 8-byte keys, in any allocator's
      // buffer — else copied once.
      if (reinterpret_cast<std::uintptr_t>(r.values.data()) % alignof(float) == 0) {
        grads.values = {reinterpret_cast<const float*>(r.values.data()), values};
        grads.message = std::move(message);
      } else {
        grads.decoded.resize(values);
        if (values != 0) std::memcpy(grads.decoded.data(), r.values.data(), values * 4);
        grads.values = grads.decoded;
      }
    } else {
      if (h.codec != wire_codec::compressed)
        fail(errc::bad_message,
             cat("ps protocol: push codec ", static_cast<int>(h.codec), " but this server expects ",
                 codec_.name, "-compressed gradients"));
      grads.decoded.resize(values);
      codec_.decode(r.values, std::span<float>(grads.decoded));  // validates the size
      grads.values = grads.decoded;
    }
    push_requests_.fetch_add(1, std::memory_order_relaxed);
    keys_pushed_.fetch_add(keys.size(), std::memory_order_relaxed);

    table_state& tab = *tables_[h.table];
    const auto w = static_cast<std::size_t>(worker);
    if (rule_.aggregates_step) {
      std::unique_lock lock(tab.mutex);
      check_push_step(tab, h.table, worker, h.step);
      ++tab.received[w];
      auto& s = tab.pending[h.step];
      start_sync_step(s);
      s.keys[w] = std::move(keys);
      s.grads[w] = std::move(grads);
      s.arrived[w] = 1;
      ++s.count;
      apply_ready_steps(t, h.table, tab, lock);
    } else {
      {
        std::lock_guard lock(tab.mutex);
        check_push_step(tab, h.table, worker, h.step);
        ++tab.received[w];
      }
      apply_rows(tab, h.table, keys, grads.values);
      comm::recycle(t, std::move(grads.message));  // a worker builds its next push in it
      std::unique_lock lock(tab.mutex);
      ++tab.applied[w];
      tab.applied_cv.notify_all();
      release_parked(t, h.table, tab, lock);
    }
  }

  /// A push must carry the worker's next step of the table (table mutex held).
  void check_push_step(const table_state& tab, std::size_t table, int worker,
                       std::uint64_t step) const {
    const std::uint64_t at = tab.received[static_cast<std::size_t>(worker)];
    if (step != at)
      fail(errc::bad_message, cat("ps protocol: push for step ", step, " of table ", table,
                                  " but worker ", worker, " is at step ", at));
  }
  /// A sync step's per-worker slots, on its first push.
  void start_sync_step(sync_step& s) const {
    if (!s.arrived.empty()) return;
    const auto workers = static_cast<std::size_t>(map_.roles().workers());
    s.keys.resize(workers);
    s.grads.resize(workers);
    s.arrived.assign(workers, 0);
  }

  /// Applies the optimizer to each (key, summed gradient) row; rows are distinct.
  void apply_rows(table_state& tab, std::size_t table, std::span<const std::uint64_t> keys,
                  std::span<const float> grads) {
    const std::size_t dim = tab.dim;
    // Parallelism comes from serving several workers at once.
    if (table == dense_table_) {
      // Its stripes in parallel (rows are distinct) on the server's own arena threads only: a
      // server of one thread (`inline_`, outside any arena) would borrow the process's oneTBB
      // pool, which the workers' model compute sizes to the machine — in one process two such
      // servers and the workers' threads then time-share the cores (measured slower).
      auto update = [&](std::size_t i, float* row) {
        dense_optimizer_.apply(std::span<float>(row, dim),
                               std::span<float>(row + dim, tab.state_floats),
                               grads.subspan(i * dim, dim));
      };
      for_each_planned_row(tab, table, keys, update, !inline_);
      return;
    }
    optim::with_table(optimizer_, table, [&](const auto& opt) {
      for_each_key_row(tab, table, keys, [&](std::size_t i, float* row) {
        opt.apply(std::span<float>(row, dim), std::span<float>(row + dim, tab.state_floats),
                  grads.subspan(i * dim, dim));
      });
    });
  }

  /// sync: applies every complete step in order (called with the table mutex held; releases
  /// it while applying), then releases the pulls that became ready.
  template <comm::transport T>
  void apply_ready_steps(T& t, std::size_t table, table_state& tab,
                         std::unique_lock<std::mutex>& lock) {
    apply_complete_steps(t, table, tab, lock);
    release_parked(t, table, tab, lock);
  }
  /// sync: applies every complete step in order (table mutex held by `lock`; released while
  /// applying).
  template <comm::transport T>
  void apply_complete_steps(T& t, std::size_t table, table_state& tab,
                            std::unique_lock<std::mutex>& lock) {
    const int workers = map_.roles().workers();
    while (!tab.applying) {
      auto it = tab.pending.find(tab.applied_steps);
      if (it == tab.pending.end() || it->second.count < workers) break;
      sync_step s = std::move(it->second);
      tab.pending.erase(it);
      tab.applying = true;
      lock.unlock();
      try {
        apply_sync_step(tab, table, s);
        for (auto& g : s.grads)  // the pushes' buffers: the workers build their next in them
          comm::recycle(t, std::move(g.message));
      } catch (...) {
        lock.lock();
        tab.applying = false;
        throw;
      }
      lock.lock();
      tab.applying = false;
      ++tab.applied_steps;
      tab.applied_cv.notify_all();
    }
  }

  /// One sync step of a table: the workers' pushes concatenated in rank order, the rows of each
  /// key summed in that order by `optim::sparse_gradient` (the function the local storages and
  /// the clients use), then the optimizer once per key.
  void apply_sync_step(table_state& tab, std::size_t table, const sync_step& s) {
    // Every push's keys are strictly ascending (the decoder checks). When all pushes carry the
    // same keys — one worker, or the dense table, which every worker pushes whole — each key's
    // rows are summed elementwise in rank order: the sums sum_duplicates would form, in its
    // order (bitwise the same), without concatenating the pushes or grouping their keys.
    const bool same_keys = std::all_of(s.keys.begin() + 1, s.keys.end(),
                                       [&](const auto& k) { return k == s.keys[0]; });
    if (same_keys) {
      if (s.grads.size() == 1) {
        apply_rows(tab, table, s.keys[0], s.grads[0].values);
        return;
      }
      tab.step_grads.assign(s.grads[0].values.begin(), s.grads[0].values.end());
      for (std::size_t w = 1; w < s.grads.size(); ++w) {
        const float* from = s.grads[w].values.data();
        float* into = tab.step_grads.data();
        for (std::size_t i = 0, n = tab.step_grads.size(); i < n; ++i)
          into[i] += from[i];
      }
      apply_rows(tab, table, s.keys[0], tab.step_grads);
      return;
    }
    tab.step_keys.clear();
    tab.step_grads.clear();
    for (std::size_t w = 0; w < s.keys.size(); ++w) {
      tab.step_keys.insert(tab.step_keys.end(), s.keys[w].begin(), s.keys[w].end());
      tab.step_grads.insert(tab.step_grads.end(), s.grads[w].values.begin(),
                            s.grads[w].values.end());
    }
    tab.summed.sum_duplicates(
        tab.step_keys,
        matrix_view<const float>(tab.step_grads.data(), tab.step_keys.size(), tab.dim));
    const auto sums = tab.summed.grads();
    apply_rows(tab, table, tab.summed.keys(),
               std::span<const float>(sums.data(), sums.rows() * sums.cols()));
  }

  /// Serves every parked pull that is ready now (table mutex held by `lock`).
  template <comm::transport T>
  void release_parked(T& t, std::size_t table, table_state& tab,
                      std::unique_lock<std::mutex>& lock) {
    std::vector<parked_pull> go;
    for (std::size_t i = 0; i < tab.parked.size();) {
      if (ready(tab, tab.parked[i].step)) {
        note_staleness(tab, tab.parked[i].step);
        go.push_back(std::move(tab.parked[i]));
        tab.parked.erase(tab.parked.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
    lock.unlock();
    for (auto& pull : go)
      spawn([this, &t, table, pull = std::move(pull)] {
        try {
          reply_pull(t, table, pull);
        } catch (const std::exception& e) {
          std::vector<std::byte> reply;
          encode_error(reply, static_cast<std::uint32_t>(pull.worker), msg_type::pull_request,
                       static_cast<std::uint32_t>(table), pull.step, errc::internal, e.what());
          send(t, map_.roles().worker_rank(pull.worker), std::move(reply));
        }
      });
    lock.lock();
  }

  struct worker_queue {
    std::deque<std::vector<std::byte>> pending;
    bool running = false;
  };

  shard_map map_;
  int index_;
  consistency_rule rule_;
  Optimizer optimizer_;
  DenseOptimizer dense_optimizer_;
  std::size_t dense_table_ = no_dense_table;
  server_options options_;
  push_decoding codec_;
  std::vector<std::unique_ptr<table_state>> tables_;
  std::mutex queue_mutex_;
  std::vector<worker_queue> queues_;
  std::mutex send_mutex_;
  std::mutex done_mutex_;
  std::condition_variable done_;
  /// serve() ended by a failure (its transport aborted or timed out): in-process readers stop
  /// waiting for steps.
  std::atomic<bool> serve_failed_{false};
  std::size_t outstanding_ = 0;
  std::exception_ptr task_failure_;
  std::deque<std::function<void()>> jobs_;
  std::condition_variable jobs_ready_;
  bool stopping_ = false;
  bool inline_ = false;  // threads == 1: serve()'s thread handles every request itself
  std::atomic<std::uint64_t> pull_requests_{0}, push_requests_{0}, keys_pulled_{0}, keys_pushed_{0},
      bytes_received_{0}, bytes_sent_{0}, deferred_pulls_{0}, max_staleness_{0};
};

/// One parameter-server shard with its consistency policy and push codec given as types (what
/// clients and trainers name): `server_core` with `rule_of<Consistency>` and PushCodec's
/// decoder. With `Consistency = run_time_rule` the rule is a constructor argument.
template <optim::table_optimizer Optimizer, consistency_choice Consistency,
          compress::compressor PushCodec = compress::identity,
          optim::sparse_optimizer DenseOptimizer = optim::default_dense_t<Optimizer>>
class server : public server_core<Optimizer, DenseOptimizer> {
  using core = server_core<Optimizer, DenseOptimizer>;

 public:
  using core_type = core;
  using consistency_type = Consistency;
  using push_codec_type = PushCodec;

  /// The shard of server `server_index` of `map`.
  server(shard_map map, int server_index, Optimizer optimizer = {}, server_options options = {},
         PushCodec codec = {}) requires consistency<Consistency>
      : core(std::move(map), server_index, rule_of<Consistency>, optimizer, options,
             push_decoding::of(std::move(codec))) {}

  /// As above, with table `dense_table` of `map` updated by `dense_optimizer`.
  server(shard_map map, int server_index, Optimizer optimizer, DenseOptimizer dense_optimizer,
         std::size_t dense_table, server_options options = {},
         PushCodec codec = {}) requires consistency<Consistency>
      : core(std::move(map), server_index, rule_of<Consistency>, optimizer, dense_optimizer,
             dense_table, options, push_decoding::of(std::move(codec))) {}

  /// The shard of server `server_index` of `map` under `rule`: any rule under run_time_rule,
  /// else Consistency's own (another is refused with errc::invalid_argument).
  server(shard_map map, int server_index, const consistency_rule& rule, Optimizer optimizer = {},
         server_options options = {}, PushCodec codec = {})
      : core(std::move(map), server_index, rule_for<Consistency>(rule, "ps::server"), optimizer,
             options, push_decoding::of(std::move(codec))) {}

  /// As above, with table `dense_table` of `map` updated by `dense_optimizer`.
  server(shard_map map, int server_index, const consistency_rule& rule, Optimizer optimizer,
         DenseOptimizer dense_optimizer, std::size_t dense_table, server_options options = {},
         PushCodec codec = {})
      : core(std::move(map), server_index, rule_for<Consistency>(rule, "ps::server"), optimizer,
             dense_optimizer, dense_table, options, push_decoding::of(std::move(codec))) {}
};

}  // namespace strata::ps

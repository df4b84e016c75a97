/// @file client.hpp
/// `client<Consistency, Transport, PushCodec>`: a worker's view of the parameter servers —
/// de-duplicated, partitioned, batched pull and push. Its code is `client_core<Transport,
/// PushCodec>`, which takes the consistency policy as a run-time value (one copy of the
/// client's code for every policy).
///
/// ```cpp
/// ps::shard_map map(ps::layout::dedicated(2, 1), {{"user", 1000, 16}});
/// // on a server rank:  ps::server<optim::sgd, ps::sync> s(map, 0); s.serve(t);
/// // on a worker rank:
/// ps::client<ps::sync> c(t, map);
/// c.pull(0, keys, rows);      // rows: keys.size() × 16
/// c.push(0, keys, grads);     // advances this worker's step of table 0
/// c.shutdown();
/// ```
#pragma once

#include <algorithm>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/compress/concepts.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/identity.hpp"
#include "strata/compress/keyed_error_feedback.hpp"
#include "strata/core/error.hpp"
#include "strata/core/key_index.hpp"
#include "strata/core/matrix.hpp"
#include "strata/optim/sparse_gradient.hpp"
#include "strata/ps/consistency.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/protocol.hpp"

namespace strata::ps {

/// Settings of a client.
/// Reads rows of one server that lives in the same process (`ps::server::read_rows`):
/// read(worker, table, step, keys, sink) calls sink(i, row) for every keys[i].
using in_process_reader =
    std::function<void(int, std::size_t, std::uint64_t, std::span<const std::uint64_t>,
                       const std::function<void(std::size_t, const float*)>&)>;

struct client_options {
  /// Pulled rows travel as IEEE fp16 (half the reply bytes; ~3 significant digits).
  bool fp16_pulls = false;
  /// With a lossy push codec, keep what compression dropped per (table, key) on the worker and
  /// add it to that key's next gradient (error feedback), so nothing is lost over steps.
  bool error_feedback = true;
  /// One reader per server (by server index) when every server lives in this process: pulls
  /// then read the servers' rows directly (no request or reply messages; pushes still travel
  /// as messages), with the same rows as the message path (fp16_pulls rounds them the same
  /// way). Empty: pulls are messages.
  std::vector<in_process_reader> in_process_servers{};
};

/// A transport endpoint shared by a co-located worker and server on one rank: forwards every
/// call, serialising sends (and sendrecv) with a mutex so two threads may send at once.
/// Receives are not serialised (the two roles wait on different tags). Models `transport`.
template <comm::transport T>
class shared_endpoint {
 public:
  explicit shared_endpoint(T& t) : t_(&t) {}
  [[nodiscard]] int rank() const { return t_->rank(); }
  [[nodiscard]] int size() const { return t_->size(); }
  [[nodiscard]] double timeout_seconds() const { return t_->timeout_seconds(); }
  void send(int peer, comm::tag_t tag, std::span<const std::byte> bytes) {
    std::lock_guard lock(*mutex_);
    t_->send(peer, tag, bytes);
  }
  /// Forwarded when T has it (`thread_transport`): a send that moves the buffer.
  void send_owned(int peer, comm::tag_t tag, std::vector<std::byte>&& bytes) requires
      requires(T& t) {
    t.send_owned(peer, tag, std::move(bytes));
  }
  {
    std::lock_guard lock(*mutex_);
    t_->send_owned(peer, tag, std::move(bytes));
  }
  /// Forwarded when T has them (`thread_transport`): recycled message buffers.
  [[nodiscard]] std::vector<std::byte> take_buffer(std::size_t bytes) requires requires(T& t) {
    t.take_buffer(bytes);
  }
  { return t_->take_buffer(bytes); }
  void recycle(std::vector<std::byte>&& bytes) requires requires(T& t) {
    t.recycle(std::move(bytes));
  }
  { t_->recycle(std::move(bytes)); }
  void recv(int peer, comm::tag_t tag, std::span<std::byte> bytes) { t_->recv(peer, tag, bytes); }
  std::vector<std::byte> recv_message(int peer, comm::tag_t tag) {
    return t_->recv_message(peer, tag);
  }
  comm::message recv_any(comm::tag_t tag) { return t_->recv_any(tag); }
  void sendrecv(int to, std::span<const std::byte> out, int from, std::span<std::byte> in,
                comm::tag_t tag) {
    std::lock_guard lock(*mutex_);
    t_->sendrecv(to, out, from, in, tag);
  }
  [[nodiscard]] std::uint64_t bytes_sent_to(int peer) const { return t_->bytes_sent_to(peer); }
  [[nodiscard]] std::uint64_t bytes_received_from(int peer) const {
    return t_->bytes_received_from(peer);
  }

 private:
  T* t_;
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
};
static_assert(comm::transport<shared_endpoint<comm::thread_transport>>);

/// One table's part of a multi-table pull (`client::pull_tables`,
/// `embedding::sharded::gather_tables`): out.row(i) ← row keys[i] of `table`.
struct table_pull {
  std::size_t table = 0;
  std::span<const std::uint64_t> keys;
  matrix_view<float> out;  ///< keys.size() × dim of the table
};

/// One table's part of a multi-table push (`client::push_tables`,
/// `embedding::sharded::apply_gradients_tables`): grads.row(i) = dLoss/d(row keys[i]).
struct table_push {
  std::size_t table = 0;
  std::span<const std::uint64_t> keys;
  matrix_view<const float> grads;  ///< keys.size() × dim of the table
};

/// A worker's endpoint to the parameter servers of a `shard_map`.
///
/// - `pull(table, keys, out)`: de-duplicates keys (one row per unique key travels), partitions
///   them by server, sends every server request, then receives every reply and scatters rows
///   back to batch order. Blocks while the consistency policy parks the pull.
/// - `push(table, keys, grads)`: sums the rows of duplicate keys (ascending key order, original
///   order within a key), partitions, and sends one summed row per unique key to its server
///   — and a (possibly empty) push to every server so each one counts the step; then advances
///   this worker's step of the table. Does not wait for the servers.
/// - `pull_tables(entries)` / `push_tables(entries)`: the same for several distinct tables at
///   once; a multi-table pull sends every request to every server before it awaits any reply
///   (one round trip for all tables, replies matched by table), with bitwise the same rows.
/// - `shutdown()`: tells every server this worker is done and waits for each to confirm that
///   all its earlier requests were handled.
/// Errors: a bad key raises `errc::out_of_range` naming table, key and range before anything
/// is sent; a server's error reply is raised here (after the other replies were drained).
/// Cost: one flat-index probe per key, a sort of the unique keys, O(unique · dim) copies;
/// buffers are reused.
/// Thread-safety: one client per worker thread; not thread-safe.
template <comm::transport Transport = comm::thread_transport,
          compress::compressor PushCodec = compress::identity>
class client_core {
  static_assert(!compress::positional_compressor<PushCodec>,
                "ps::client: pass the plain codec (e.g. int8_block<256>); the client keeps the "
                "error-feedback residual per key itself (client_options::error_feedback)");

 public:
  using transport_type = Transport;
  using push_codec_type = PushCodec;
  static constexpr bool lossless_push = std::is_same_v<PushCodec, compress::identity>;

  /// A client on rank `t.rank()`, which must be a worker of `map`'s layout, under policy
  /// `rule` (the servers' policy: they refuse requests of another).
  client_core(Transport& t, shard_map map, consistency_rule rule, client_options options = {},
              PushCodec codec = {})
      : t_(&t), map_(std::move(map)), rule_(rule), options_(options), codec_(std::move(codec)) {
    check_rule(rule_, "ps::client");
    map_.roles().check_size(t.size());
    worker_ = map_.roles().worker_index(t.rank());
    const auto servers = static_cast<std::size_t>(map_.roles().servers());
    STRATA_EXPECTS(
        options_.in_process_servers.empty() || options_.in_process_servers.size() == servers,
        "ps::client: ", options_.in_process_servers.size(), " in-process server readers for ",
        servers, " servers (give one per server, or none)");
    steps_.assign(map_.table_count(), 0);
    feedback_.reserve(map_.table_count());
    for (std::size_t t = 0; t < map_.table_count(); ++t)
      feedback_.emplace_back(map_.spec(t).dim, codec_);
    server_keys_.resize(servers);
    server_slots_.resize(servers);
    messages_.resize(servers);
  }

  [[nodiscard]] const shard_map& map() const noexcept { return map_; }
  [[nodiscard]] int worker() const noexcept { return worker_; }
  /// This worker's step of table t (the number of pushes done).
  [[nodiscard]] std::uint64_t step(std::size_t t) const {
    map_.check_table(t, "ps::client::step");
    return steps_[t];
  }

  /// out.row(i) ← row keys[i] of `table`, from the servers (a multi-table pull of one table).
  void pull(std::size_t table, std::span<const std::uint64_t> keys, matrix_view<float> out) {
    const table_pull one{table, keys, out};
    pull_batch(std::span(&one, 1), "ps::client::pull");
  }

  /// Multi-table pull: for every entry, out.row(i) ← row keys[i] of its table. Every request
  /// to every server is sent before any reply is awaited, so k tables cost one round trip
  /// (plus O(k) per-message work) instead of k; results are bitwise those of k `pull` calls.
  /// The tables must be distinct. Everything is validated before anything is sent.
  void pull_tables(std::span<const table_pull> pulls) {
    pull_batch(pulls, "ps::client::pull_tables");
  }

  /// Split-phase `pull_tables`: sends every request and returns at once; `finish_pull_tables`
  /// (called with the same entries, whose keys and `out` must stay valid until then) waits for
  /// the replies and fills `out`. The requests carry this worker's step at `begin`, as
  /// `pull_tables` would, so the servers answer once their policy allows that step. Under
  /// ps::async pushes may come in between and do not wait (the rows may predate them: the
  /// staleness async allows). Under ps::sync and ps::bounded a push while the pull is in flight
  /// is refused (the rows could predate it); there, begin the next step's pull right after this
  /// step's push and do other work (the dense allreduce) until `finish`: the rows are bitwise
  /// those of a `pull_tables` at `begin`. One batch in flight at a time.
  void begin_pull_tables(std::span<const table_pull> pulls) {
    begin_batch(pulls, "ps::client::begin_pull_tables");
  }
  void finish_pull_tables(std::span<const table_pull> pulls) {
    STRATA_EXPECTS(in_flight_,
                   "ps::client::finish_pull_tables: no pull in flight (call "
                   "begin_pull_tables first)");
    STRATA_EXPECTS(pulls.size() == in_flight_entries_,
                   "ps::client::finish_pull_tables: ", pulls.size(), " entries but ",
                   in_flight_entries_, " were begun; pass the same entries");
    finish_batch(pulls, "ps::client::finish_pull_tables");
  }
  /// A split-phase pull has been begun and not finished.
  [[nodiscard]] bool pull_in_flight() const noexcept { return in_flight_; }

  /// Sends dLoss/d(row keys[i]) = grads.row(i), summed per unique key, to the servers.
  void push(std::size_t table, std::span<const std::uint64_t> keys,
            matrix_view<const float> grads) {
    const table_push one{table, keys, grads};
    push_tables(std::span(&one, 1), "ps::client::push");
  }

  /// Multi-table push: `push` of every entry, in order (the tables must be distinct). Every
  /// entry is validated before anything is sent, so a bad entry sends nothing and advances no
  /// step. Does not wait for the servers.
  void push_tables(std::span<const table_push> pushes,
                   const char* who = "ps::client::push_tables") {
    if (rule_.blocks_on_step)
      STRATA_EXPECTS(!in_flight_, who, ": a begun pull is still in flight; under ps::", rule_.name,
                     " finish_pull_tables it before pushing (a pull may not overlap this "
                     "worker's own push; begin the next pull after this step's push)");
    check_batch(pushes, who, [&](const table_push& p) {
      if (p.grads.rows() != p.keys.size() || p.grads.cols() != map_.spec(p.table).dim)
        fail(errc::size_mismatch,
             cat(who, ": grads are ", p.grads.rows(), " × ", p.grads.cols(), " but table ", p.table,
                 " needs ", p.keys.size(), " × ", map_.spec(p.table).dim));
    });
    for (const table_push& p : pushes)
      push_one(p.table, p.keys, p.grads);
  }

  /// Tells every server this worker is done; returns once each confirmed. Raises the first
  /// error a server reported (e.g. for an earlier push).
  void shutdown() {
    const auto servers = static_cast<std::size_t>(map_.roles().servers());
    for (std::size_t s = 0; s < servers; ++s) {
      header h;
      h.type = msg_type::shutdown;
      h.worker = static_cast<std::uint32_t>(worker_);
      h.policy = rule_.code;
      start_message(messages_[s], h);
      t_->send(server_rank(s), comm::tags::ps_request, messages_[s]);
    }
    std::optional<error> first;
    for (std::size_t s = 0; s < servers; ++s) {
      for (;;) {
        const auto bytes = t_->recv_message(server_rank(s), comm::tags::ps_reply);
        const header h = decode_header(bytes);
        if (h.type == msg_type::shutdown_ack) break;
        if (h.type != msg_type::error_reply)
          fail(errc::bad_message, cat("ps::client::shutdown: unexpected reply type ",
                                      static_cast<int>(h.type), " from server ", s));
        const auto info = decode_error(h, bytes);
        if (!first) first = error(info.code, info.text);
        if (info.failed == msg_type::shutdown) break;
      }
    }
    if (first) throw *first;
  }

  /// Calls fn(table, key, residual row) for every key that has an error-feedback residual (to
  /// carry residuals into a later client or a checkpoint).
  template <class Fn>
  void for_each_residual(Fn&& fn) const {
    for (std::size_t t = 0; t < feedback_.size(); ++t)
      feedback_[t].for_each_residual(
          [&](std::uint64_t key, std::span<const float> row) { fn(t, key, row); });
  }
  /// Sets the error-feedback residual of row `key` of table t (see for_each_residual).
  void restore_residual(std::size_t t, std::uint64_t key, std::span<const float> values) {
    map_.check_table(t, "ps::client::restore_residual");
    const std::size_t dim = map_.spec(t).dim;
    STRATA_EXPECTS(values.size() == dim, "ps::client::restore_residual: ", values.size(),
                   " values for a row of table ", t, " with dim ", dim);
    feedback_[t].restore(key, values);
  }

  /// Error-feedback residual of row `key` of table t (zeros if none yet); for tests.
  [[nodiscard]] std::vector<float> residual(std::size_t t, std::uint64_t key) const {
    map_.check_table(t, "ps::client::residual");
    return feedback_[t].residual(key);
  }

 private:
  [[nodiscard]] static bool strictly_ascending(std::span<const std::uint64_t> keys) noexcept {
    return std::adjacent_find(keys.begin(), keys.end(), std::greater_equal<>()) == keys.end();
  }
  [[nodiscard]] bool in_process() const noexcept { return !options_.in_process_servers.empty(); }
  [[nodiscard]] int server_rank(std::size_t s) const {
    return map_.roles().server_rank(static_cast<int>(s));
  }
  [[nodiscard]] header request(msg_type type, std::size_t table) const {
    header h;
    h.type = type;
    h.worker = static_cast<std::uint32_t>(worker_);
    h.table = static_cast<std::uint32_t>(table);
    h.step = steps_[table];
    h.dim = static_cast<std::uint32_t>(map_.spec(table).dim);
    h.policy = rule_.code;
    return h;
  }

  /// One table's push (validated by the caller): sum duplicates, partition, encode, send.
  void push_one(std::size_t table, std::span<const std::uint64_t> keys,
                matrix_view<const float> grads) {
    const std::size_t dim = map_.spec(table).dim;
    // Strictly ascending keys (e.g. the dense table's rows 0..R-1) have nothing to sum or
    // sort: their rows go out as given (the same bits sum_duplicates would produce).
    const bool distinct = strictly_ascending(keys);
    if (!distinct) summed_.sum_duplicates(keys, grads);
    const std::span<const std::uint64_t> unique = distinct ? keys : summed_.keys();
    const matrix_view<const float> summed =
        distinct ? grads : matrix_view<const float>(summed_.grads());
    const auto servers = static_cast<std::size_t>(map_.roles().servers());
    for (auto& k : server_keys_)
      k.clear();
    for (auto& k : server_slots_)
      k.clear();
    for (std::size_t u = 0; u < unique.size(); ++u) {
      const std::size_t s = map_.server_of(table, unique[u]);
      server_keys_[s].push_back(unique[u]);
      server_slots_[s].push_back(u);
    }
    for (std::size_t s = 0; s < servers; ++s) {
      const auto& skeys = server_keys_[s];
      const std::size_t n = skeys.size(), values = n * dim;
      header h = request(msg_type::push_request, table);
      h.key_count = n;
      auto& message = messages_[s];
      if constexpr (lossless_push) {
        h.codec = wire_codec::fp32;
        h.payload_bytes = n * 8 + values * 4;
        reserve_message(message, header_bytes + h.payload_bytes);
        const auto payload = start_message(message, h);
        if (n != 0) std::memcpy(payload.data(), skeys.data(), n * 8);
        for (std::size_t j = 0; j < n; ++j)
          std::memcpy(payload.data() + n * 8 + j * dim * 4, summed.row(server_slots_[s][j]).data(),
                      dim * 4);
      } else {
        h.codec = wire_codec::compressed;
        const std::size_t bound = codec_.max_encoded_bytes(values);
        h.payload_bytes = n * 8 + bound;
        reserve_message(message, header_bytes + h.payload_bytes);
        const auto payload = start_message(message, h);
        if (n != 0) std::memcpy(payload.data(), skeys.data(), n * 8);
        staged_.resize(values);
        for (std::size_t j = 0; j < n; ++j) {
          const auto g = summed.row(server_slots_[s][j]);
          std::copy(g.begin(), g.end(), staged_.begin() + static_cast<std::ptrdiff_t>(j * dim));
        }
        // With error feedback each key's residual rides along (compress::keyed_error_feedback).
        const std::size_t written =
            options_.error_feedback
                ? feedback_[table].encode_rows(skeys, staged_, payload.subspan(n * 8))
                : codec_.encode(staged_, payload.subspan(n * 8));
        finish_message(message, n * 8 + written);
      }
      comm::send_moving(*t_, server_rank(s), comm::tags::ps_request, message);
    }
    ++steps_[table];
  }

  /// Before building a message of `bytes` into `buffer`: when `buffer` is smaller — its last
  /// contents moved away by `comm::send_moving` — one a receiver handed back, where the
  /// transport recycles them (`thread_transport`), so a large push allocates nothing.
  void reserve_message(std::vector<std::byte>& buffer, std::size_t bytes) {
    if (buffer.capacity() >= bytes) return;
    auto pooled = comm::take_recycled(*t_, bytes);
    if (pooled.capacity() >= bytes) buffer = std::move(pooled);
  }

  /// What one table of a pull keeps between sending its requests and scattering the rows.
  struct pull_state {
    std::size_t table = 0, dim = 0;
    std::uint64_t step = 0;              // the step the requests carried
    std::vector<std::uint64_t> unique;   // distinct keys, ascending (the protocol's order)
    std::vector<std::uint32_t> slot_of;  // keys[i] → index in unique
    std::vector<std::vector<std::uint64_t>> server_keys;   // per server: its unique keys
    std::vector<std::vector<std::uint32_t>> server_slots;  // per server: their indexes in unique
    std::vector<std::vector<std::byte>> replies;           // per server: its reply (empty: none)
    std::vector<const std::byte*> source;                  // fp32: unique row u in a reply
    std::vector<float> rows;                               // in-process: unique rows
    matrix_view<float> out;  // the pull's output; in-process, strictly ascending keys in fp32
    bool direct = false;     // are read into it directly (unique row u is out's row u)
  };

  /// Validates a batch before anything is sent: table indexes, distinct tables, keys inside
  /// fixed tables, then `shape(entry)`.
  template <class Entry, class Shape>
  void check_batch(std::span<const Entry> batch, const char* who, Shape&& shape) {
    marks_.assign(map_.table_count(), 0);
    for (const Entry& e : batch) {
      map_.check_keys(e.table, e.keys, who);
      if (marks_[e.table]++ != 0)
        fail(errc::invalid_argument, cat(who, ": table ", e.table,
                                         " appears twice in one batch; pass each table once "
                                         "(concatenate its keys)"));
      shape(e);
    }
  }

  void pull_batch(std::span<const table_pull> pulls, const char* who) {
    begin_batch(pulls, who);
    finish_batch(pulls, who);
  }
  void begin_batch(std::span<const table_pull> pulls, const char* who) {
    STRATA_EXPECTS(!in_flight_, who,
                   ": a begun pull is still in flight (finish_pull_tables it "
                   "first)");
    check_batch(pulls, who, [&](const table_pull& p) {
      const std::size_t dim = map_.spec(p.table).dim;
      if (p.out.rows() != p.keys.size() || p.out.cols() != dim)
        fail(errc::size_mismatch,
             cat(who, ": out is ", p.out.rows(), " × ", p.out.cols(), " but table ", p.table,
                 " needs ", p.keys.size(), " × ", dim));
    });
    const auto servers = static_cast<std::size_t>(map_.roles().servers());
    const wire_codec codec = options_.fp16_pulls ? wire_codec::fp16 : wire_codec::fp32;
    if (states_.size() < pulls.size()) states_.resize(pulls.size());
    position_.assign(map_.table_count(), -1);
    pending_.assign(servers, 0);
    for (std::size_t p = 0; p < pulls.size(); ++p) {
      pull_state& st = states_[p];
      st.table = pulls[p].table;
      st.dim = map_.spec(st.table).dim;
      st.step = steps_[st.table];
      position_[st.table] = static_cast<std::ptrdiff_t>(p);
      const bool ascending = deduplicate(pulls[p].keys, st);
      st.out = pulls[p].out;
      st.direct = in_process() && !options_.fp16_pulls && ascending;
      partition(st, servers);
      if (in_process()) continue;  // read at finish (at once under async: see below)
      for (std::size_t s = 0; s < servers; ++s) {
        const auto& skeys = st.server_keys[s];
        if (skeys.empty()) continue;
        header h = request(msg_type::pull_request, st.table);
        h.codec = codec;
        h.key_count = skeys.size();
        h.payload_bytes = skeys.size() * 8;
        const auto payload = start_message(messages_[s], h);
        std::memcpy(payload.data(), skeys.data(), skeys.size() * 8);
        t_->send(server_rank(s), comm::tags::ps_request, messages_[s]);
        ++pending_[s];
      }
    }
    in_flight_ = true;
    in_flight_entries_ = pulls.size();
    in_flight_codec_ = codec;
    // In-process under async the rows are read now, as a server serves a pull message when it
    // arrives (after this worker's earlier pushes); under sync and bounded at finish, when the
    // servers may be waiting for other workers' pushes.
    in_process_read_ = in_process() && !rule_.blocks_on_step;
    if (in_process_read_) read_in_process(pulls.size());
  }
  /// Every table of the batch from the in-process servers into st.rows (unique × dim).
  void read_in_process(std::size_t count) {
    const compress::fp16 half;
    for (std::size_t p = 0; p < count; ++p) {
      pull_state& st = states_[p];
      const std::size_t dim = st.dim;
      // Strictly ascending keys are their own unique list (deduplicate: unique row u is key
      // u), so their rows go straight into the pull's output.
      if (!st.direct) st.rows.resize(st.unique.size() * dim);
      for (std::size_t s = 0; s < st.server_keys.size(); ++s) {
        if (st.server_keys[s].empty()) continue;
        const auto& slots = st.server_slots[s];
        options_.in_process_servers[s](
            worker_, st.table, st.step, st.server_keys[s], [&](std::size_t j, const float* row) {
              float* into =
                  st.direct ? st.out.row(slots[j]).data() : st.rows.data() + slots[j] * dim;
              std::copy_n(row, dim, into);
            });
      }
      if (options_.fp16_pulls) {  // the rows a fp16 reply would carry
        half_bytes_.resize(half.max_encoded_bytes(st.rows.size()));
        const std::size_t bytes = half.encode(st.rows, half_bytes_);
        half.decode(std::span<const std::byte>(half_bytes_.data(), bytes),
                    std::span<float>(st.rows));
      }
    }
  }
  void finish_batch(std::span<const table_pull> pulls, const char* who) {
    in_flight_ = false;
    if (in_process()) {
      if (!in_process_read_) read_in_process(pulls.size());
      for (std::size_t p = 0; p < pulls.size(); ++p) {
        const pull_state& st = states_[p];
        if (st.direct) continue;  // read into the output already
        for (std::size_t i = 0; i < pulls[p].keys.size(); ++i)
          std::copy_n(st.rows.data() + st.slot_of[i] * st.dim, st.dim, pulls[p].out.row(i).begin());
      }
      return;
    }
    const wire_codec codec = in_flight_codec_;
    const auto servers = static_cast<std::size_t>(map_.roles().servers());
    std::optional<error> first;
    for (std::size_t s = 0; s < servers; ++s)
      while (pending_[s] > 0) {
        try {
          receive_pull_reply(s, codec, who, first);
        } catch (const error& e) {
          if (e.code() == errc::timeout || e.code() == errc::aborted) throw;
          if (!first) first = e;
        }
      }
    if (first) throw *first;
    for (std::size_t p = 0; p < pulls.size(); ++p) {
      scatter(states_[p], pulls[p], codec);
      for (auto& reply : states_[p].replies)  // a server builds its next large reply in one
        comm::recycle(*t_, std::move(reply));
    }
  }

  /// st.unique ← the distinct keys, ascending; st.slot_of[i] ← index of keys[i] in st.unique.
  /// One flat-index probe per key, then a sort of the distinct keys only (with Zipf ids far
  /// fewer than n). Returns whether `keys` were strictly ascending (then st.unique = keys).
  bool deduplicate(std::span<const std::uint64_t> keys, pull_state& st) {
    const std::size_t n = keys.size();
    if (strictly_ascending(keys)) {  // already distinct and in the protocol's order
      st.unique.assign(keys.begin(), keys.end());
      st.slot_of.resize(n);
      std::iota(st.slot_of.begin(), st.slot_of.end(), std::uint32_t{0});
      return true;
    }
    seen_.clear();
    seen_.reserve(n);
    st.slot_of.resize(n);
    for (std::size_t i = 0; i < n; ++i)
      st.slot_of[i] = static_cast<std::uint32_t>(seen_.find_or_insert(keys[i]).first);
    const auto distinct = seen_.keys();
    order_.resize(distinct.size());
    for (std::size_t u = 0; u < distinct.size(); ++u)
      order_[u] = {distinct[u], u};
    std::sort(order_.begin(), order_.end());
    st.unique.resize(distinct.size());
    rank_.resize(distinct.size());
    for (std::size_t r = 0; r < order_.size(); ++r) {
      st.unique[r] = order_[r].first;
      rank_[order_[r].second] = r;
    }
    for (auto& slot : st.slot_of)
      slot = static_cast<std::uint32_t>(rank_[slot]);
    return false;
  }
  void partition(pull_state& st, std::size_t servers) {
    st.server_keys.resize(servers);
    st.server_slots.resize(servers);
    st.replies.resize(servers);
    for (std::size_t s = 0; s < servers; ++s) {
      st.server_keys[s].clear();
      st.server_slots[s].clear();
      st.replies[s].clear();
    }
    for (std::size_t u = 0; u < st.unique.size(); ++u) {
      const std::size_t s = map_.server_of(st.table, st.unique[u]);
      st.server_keys[s].push_back(st.unique[u]);
      st.server_slots[s].push_back(static_cast<std::uint32_t>(u));
    }
  }

  /// Receives one reply of server s to a pending pull of this batch and keeps it in the state
  /// of the table it answers (replies may arrive in any order: a parked pull is answered
  /// later). An error reply to a pull answers that pull; error replies to earlier pushes are
  /// recorded in `first`. A reply that answers nothing pending raises `errc::bad_message`.
  void receive_pull_reply(std::size_t s, wire_codec codec, const char* who,
                          std::optional<error>& first) {
    auto bytes = t_->recv_message(server_rank(s), comm::tags::ps_reply);
    header h;
    try {
      h = decode_header(bytes);
    } catch (...) {
      --pending_[s];  // it answers nothing we can name; count it so the batch ends
      throw;
    }
    if (h.type == msg_type::error_reply) {
      const auto info = decode_error(h, bytes);
      if (info.failed == msg_type::pull_request) --pending_[s];
      if (!first) first = error(info.code, info.text);
      return;
    }
    --pending_[s];
    const std::ptrdiff_t p = h.table < position_.size() ? position_[h.table] : -1;
    pull_state* st = p >= 0 ? &states_[static_cast<std::size_t>(p)] : nullptr;
    if (h.type != msg_type::pull_reply || h.worker != static_cast<std::uint32_t>(worker_) ||
        st == nullptr || st->server_keys[s].empty() || !st->replies[s].empty() ||
        h.step != st->step || h.key_count != st->server_keys[s].size() || h.dim != st->dim ||
        h.codec != codec)
      fail(errc::bad_message,
           cat(who, ": reply from server ", s, " (type ", static_cast<int>(h.type), ", worker ",
               h.worker, ", table ", h.table, ", step ", h.step, ", ", h.key_count, " keys, dim ",
               h.dim, ", codec ", static_cast<int>(h.codec), ") answers no pending pull of worker ",
               worker_,
               st == nullptr ? std::string(" (no pull of that table is pending)")
                             : cat(" (pending: step ", st->step, ", ", st->server_keys[s].size(),
                                   " keys, dim ", st->dim, ")")));
    const std::size_t values = row_values(h);
    if (payload_of(bytes).size() != values * value_bytes(codec))
      fail(errc::bad_message,
           cat(who, ": reply from server ", s, " for table ", h.table, " carries ",
               payload_of(bytes).size(), " bytes for ", values, " values"));
    st->replies[s] = std::move(bytes);
  }

  /// Scatters a table's received rows back to batch order: fp32 rows are copied once, from
  /// the reply buffers straight into `out`; fp16 rows are decoded first.
  void scatter(pull_state& st, const table_pull& pull, wire_codec codec) {
    const std::size_t dim = st.dim, servers = st.replies.size();
    if (codec == wire_codec::fp32) {
      st.source.resize(st.unique.size());
      for (std::size_t s = 0; s < servers; ++s) {
        const auto& slots = st.server_slots[s];
        if (slots.empty()) continue;  // no reply buffer: no offset into it either
        const std::byte* rows = st.replies[s].data() + header_bytes;
        for (std::size_t j = 0; j < slots.size(); ++j)
          st.source[slots[j]] = rows + j * dim * 4;
      }
      for (std::size_t i = 0; i < pull.keys.size(); ++i)
        std::memcpy(pull.out.row(i).data(), st.source[st.slot_of[i]], dim * 4);
    } else {
      st.rows.resize(st.unique.size() * dim);
      const compress::fp16 half;
      for (std::size_t s = 0; s < servers; ++s) {
        const auto& slots = st.server_slots[s];
        if (slots.empty()) continue;
        staged_.resize(slots.size() * dim);
        half.decode(payload_of(st.replies[s]), std::span<float>(staged_));
        for (std::size_t j = 0; j < slots.size(); ++j)
          std::copy_n(staged_.data() + j * dim, dim, st.rows.data() + slots[j] * dim);
      }
      for (std::size_t i = 0; i < pull.keys.size(); ++i)
        std::copy_n(st.rows.data() + st.slot_of[i] * dim, dim, pull.out.row(i).begin());
    }
  }

  Transport* t_;
  shard_map map_;
  consistency_rule rule_;
  client_options options_;
  PushCodec codec_;
  int worker_ = 0;
  std::vector<std::uint64_t> steps_;
  /// Per table: the push residuals per key (used with client_options::error_feedback).
  std::vector<compress::keyed_error_feedback<PushCodec>> feedback_;
  key_index seen_;  // de-duplication of the current pull
  std::vector<std::pair<std::uint64_t, std::size_t>> order_;
  std::vector<std::size_t> rank_;
  std::vector<pull_state> states_;        // per table of the current pull batch
  std::vector<std::ptrdiff_t> position_;  // table → its index in the pull batch (or −1)
  std::vector<std::size_t> pending_;      // per server: replies still awaited
  bool in_flight_ = false;                // a begun pull awaits finish_batch
  bool in_process_read_ = false;          // in-process: the begun pull's rows were read at begin
  std::vector<std::byte> half_bytes_;     // in-process fp16 rounding
  std::size_t in_flight_entries_ = 0;
  wire_codec in_flight_codec_ = wire_codec::fp32;
  std::vector<unsigned char> marks_;  // per table: seen in the batch being checked
  std::vector<std::vector<std::uint64_t>> server_keys_;  // push: per server
  std::vector<std::vector<std::size_t>> server_slots_;
  std::vector<std::vector<std::byte>> messages_;
  std::vector<float> staged_;
  optim::sparse_gradient summed_;
};

/// A worker's client with its consistency policy given as a type (what servers, storages and
/// trainers name): `client_core` with `rule_of<Consistency>`. With `Consistency =
/// run_time_rule` the rule is a constructor argument.
template <consistency_choice Consistency, comm::transport Transport = comm::thread_transport,
          compress::compressor PushCodec = compress::identity>
class client : public client_core<Transport, PushCodec> {
 public:
  using consistency_type = Consistency;

  /// A client on rank `t.rank()`, which must be a worker of `map`'s layout.
  client(Transport& t, shard_map map, client_options options = {},
         PushCodec codec = {}) requires consistency<Consistency>
      : client_core<Transport, PushCodec>(t, std::move(map), rule_of<Consistency>, options,
                                          std::move(codec)) {}

  /// As above, under `rule`: any rule under run_time_rule, else Consistency's own (another is
  /// refused with errc::invalid_argument).
  client(Transport& t, shard_map map, const consistency_rule& rule, client_options options = {},
         PushCodec codec = {})
      : client_core<Transport, PushCodec>(t, std::move(map),
                                          rule_for<Consistency>(rule, "ps::client"), options,
                                          std::move(codec)) {}
};

}  // namespace strata::ps

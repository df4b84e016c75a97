/// @file trainer.hpp
/// `trainer<Model, Storage, Communicator, Compressor>`: the CTR training loop, composed at
/// compile time from a model, an embedding storage, a communicator policy and a gradient
/// compressor.
///
/// ```cpp
/// using my_trainer = strata::train::trainer<
///     strata::models::dlrm,
///     strata::embedding::sharded<strata::optim::adagrad>,
///     strata::train::hybrid<strata::ps::sync>,
///     strata::compress::error_feedback<strata::compress::int8_block<256>>>;
/// my_trainer trainer(model_config, strata::optim::adagrad{.lr = 0.05f}, options);
/// auto report = trainer.fit(train_set, &eval_set);
/// ```
///
/// One step on worker w (global step s): its slice of global batch s → pull/gather the
/// embedding rows → forward, loss, backward → dense gradients summed over workers (allreduce,
/// or pushed to the PS) → the storage's optimizer updates dense rows → embedding row gradients
/// pushed to the PS (or exchanged among workers and applied to every replica).
/// Training runs in segments between evaluations and checkpoints; at a segment boundary every
/// rank is idle, so checkpoints capture one consistent state.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "strata/comm/collectives.hpp"
#include "strata/comm/group.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/compress/compressed_allreduce.hpp"
#include "strata/compress/concepts.hpp"
#include "strata/compress/error_feedback.hpp"
#include "strata/compress/identity.hpp"
#include "strata/core/error.hpp"
#include "strata/core/progress.hpp"
#include "strata/core/timer.hpp"
#include "strata/data/batch.hpp"
#include "strata/data/metrics.hpp"
#include "strata/data/sampler.hpp"
#include "strata/embedding/concepts.hpp"
#include "strata/embedding/init.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/concepts.hpp"
#include "strata/nn/loss.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/optim/sparse_gradient.hpp"
#include "strata/ps/layout.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/server.hpp"
#include "strata/train/checkpoint.hpp"
#include "strata/train/detail/exchange.hpp"
#include "strata/train/options.hpp"
#include "strata/train/strategy.hpp"

namespace strata::train {

namespace detail {

template <class S>
concept sharded_storage = requires {
  typename S::client_type;
  typename S::server_type;
};

/// The codec that goes on the wire for a compressor (error_feedback<C> sends C).
template <class C>
struct wire_codec {
  using type = C;
  static constexpr bool feedback = false;
};
template <class C>
struct wire_codec<compress::error_feedback<C>> {
  using type = C;
  static constexpr bool feedback = true;
};

/// The storage type a worker really uses: sharded storage rebound to the communicator's
/// consistency, the trainer's transport and the wire codec; local storage as given.
template <class Storage, class Consistency, class Transport, class Codec, bool sharded>
struct resolved_storage {
  using type = Storage;
};
template <class Storage, class Consistency, class Transport, class Codec>
struct resolved_storage<Storage, Consistency, Transport, Codec, true> {
  using type = embedding::sharded<typename Storage::optimizer_type, Consistency, Transport, Codec>;
};

/// Order-independent checksum of rows: wrapping sum of a hash of (table, key, bits of row).
inline std::uint64_t row_hash(std::size_t table, std::uint64_t key, std::span<const float> row) {
  std::uint64_t h = mix_ids(table + 1, key);
  for (float v : row)
    h = mix_ids(h, std::bit_cast<std::uint32_t>(v));
  return h;
}
inline std::uint64_t values_checksum(std::span<const float> values) {
  std::uint64_t h = 0x5354524154410000ull;
  for (float v : values)
    h = mix_ids(h, std::bit_cast<std::uint32_t>(v));
  return h;
}

/// Appends trivially copyable values to a byte blob / reads them back with bounds checks.
struct blob_writer {
  std::vector<std::byte>& out;
  template <class T>
  void put(std::span<const T> values) {
    const auto bytes = std::as_bytes(values);
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
  template <class T>
  void put_value(const T& v) {
    put(std::span<const T>(&v, 1));
  }
};
struct blob_reader {
  std::span<const std::byte> in;
  std::size_t at = 0;
  template <class T>
  std::span<const T> take(std::size_t count) {
    if ((in.size() - at) / sizeof(T) < count)
      fail(errc::bad_message, cat("trainer: sparse-gradient exchange message truncated at byte ",
                                  at, " of ", in.size()));
    const auto* first = reinterpret_cast<const T*>(in.data() + at);
    at += count * sizeof(T);
    return {first, count};
  }
};

}  // namespace detail

/// The CTR trainer. Model: a `models::ctr_model`; Storage: `embedding::local<Opt>` /
/// `embedding::hash_table<Opt>` (ring_allreduce) or `embedding::sharded<Opt>` (PS strategies);
/// Communicator: `comm::ring_allreduce`, `parameter_server<Consistency>` or
/// `hybrid<Consistency>`; Compressor: a `compress::compressor` for dense gradients and PS
/// pushes (`error_feedback<C>` keeps residuals on the workers).
///
/// Optimizers per part: the Storage's optimizer updates the embedding rows; DenseOptimizer
/// (any `optim::sparse_optimizer`, by default the Storage's) updates the dense parameters, cut
/// into rows of `dense_row` values — e.g. row-wise Adagrad for the tables and Adam for the MLP,
/// as DLRM and TorchRec users train. Every strategy applies the very same functions to the same
/// sums (under `parameter_server` the servers apply DenseOptimizer to the dense table).
/// Not thread-safe; `fit` runs the whole world on threads.
template <models::ctr_model Model, class Storage, communicator Communicator,
          compress::compressor Compressor = compress::identity,
          comm::transport Transport = comm::thread_transport,
          optim::sparse_optimizer DenseOptimizer = typename Storage::optimizer_type>
class trainer {
  using traits = communicator_traits<Communicator>;
  static constexpr bool on_ps = detail::sharded_storage<Storage>;
  static_assert(!(traits::embeddings_on_ps && !on_ps),
                "parameter_server and hybrid keep the embedding tables on parameter servers: use "
                "embedding::sharded<Optimizer> as the Storage");
  static_assert(!(!traits::embeddings_on_ps && on_ps),
                "ring_allreduce replicates the embedding tables on every worker: it needs local "
                "storage (embedding::local or embedding::hash_table), not embedding::sharded");
  static_assert(optim::sparse_optimizer<typename Storage::optimizer_type>,
                "the Storage's optimizer_type must model optim::sparse_optimizer");
  static_assert(!(traits::dense_on_ps && !on_ps), "internal: dense on PS needs PS storage");
  static_assert(
      [] {
        if constexpr (requires { traits::allreduce_supported; })
          return traits::allreduce_supported;
        else
          return true;
      }(),
      "hybrid<Consistency, Allreduce>: the trainer sums dense gradients with strata's ring "
      "allreduce (rank-ordered when deterministic); other Allreduce policies such as "
      "mpi::native_allreduce are not used by the trainer yet, so it refuses them instead of "
      "silently ignoring them: use hybrid<Consistency>");

 public:
  using model_type = Model;
  using optimizer_type = typename Storage::optimizer_type;  ///< the embedding tables'
  using dense_optimizer_type = DenseOptimizer;              ///< the dense parameters'
  using consistency_type = typename traits::consistency;
  using transport_type = Transport;
  using wire_codec_type = typename detail::wire_codec<Compressor>::type;
  static constexpr bool error_feedback = detail::wire_codec<Compressor>::feedback;
  using storage_type = typename detail::resolved_storage<Storage, consistency_type, transport_type,
                                                         wire_codec_type, on_ps>::type;
  static constexpr bool lossless = std::is_same_v<wire_codec_type, compress::identity>;
  static constexpr const char* strategy_name = traits::name;

  /// A trainer for every rank of a `thread_world` (`local_rank` < 0; train with
  /// `fit(train, eval)`), or for one process of a multi-process world such as MPI
  /// (`local_rank` = this process's rank; train with `fit(transport, train, eval)` on every
  /// process: only this rank's worker and server state is built here).
  ///
  /// This form uses `optimizer` for the dense parameters too (DenseOptimizer must then be the
  /// Storage's optimizer).
  trainer(typename Model::config model_config, optimizer_type optimizer, trainer_options options,
          int local_rank = -1) requires std::is_same_v<DenseOptimizer, optimizer_type>
      : trainer(std::move(model_config), optimizer, optimizer, std::move(options), local_rank) {}

  /// As above, with `dense_optimizer` for the dense parameters (the MLPs).
  trainer(typename Model::config model_config, optimizer_type optimizer,
          dense_optimizer_type dense_optimizer, trainer_options options, int local_rank = -1)
      : model_config_(std::move(model_config)),
        optimizer_(optimizer),
        dense_optimizer_(dense_optimizer),
        options_(std::move(options)),
        local_rank_(local_rank) {
    options_.check();
    if constexpr (requires { model_config_.seed; }) model_config_.seed = options_.seed;
    Model probe(model_config_);
    tables_ = probe.tables();
    sparse_columns_ = probe.sparse_features();
    if constexpr (requires { probe.zero_initialised(std::size_t{}); })
      for (std::size_t t = 0; t < tables_.size(); ++t)
        zero_tables_.push_back(probe.zero_initialised(t));
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      key_columns_.push_back(probe.input_column(t));
      STRATA_EXPECTS(key_columns_.back() < sparse_columns_, "trainer: the model's table ", t,
                     " reads sparse column ", key_columns_.back(), " but the model has ",
                     sparse_columns_, " sparse columns (input_column must be < sparse_features)");
    }
    dense_count_ = probe.parameters().size();
    dense_rows_ = (dense_count_ + options_.dense_row - 1) / options_.dense_row;
    dense_state_floats_ = dense_optimizer_type::state_floats(options_.dense_row);
    roles_ = make_layout();
    STRATA_EXPECTS(local_rank_ < ranks(), "trainer: local rank ", local_rank_, " outside the ",
                   ranks(), " ranks of this configuration (", options_.workers, " workers",
                   on_ps ? cat(", ", options_.servers, " servers") : std::string(), ")");
    // Persistent per-worker state (replicas of dense parameters and, for allreduce, tables),
    // built only for the workers that run in this process.
    workers_.resize(static_cast<std::size_t>(options_.workers));
    for (int w = 0; w < options_.workers; ++w)
      if (is_local(rank_of_worker(w)))
        workers_[static_cast<std::size_t>(w)] = std::make_unique<worker_state>(*this);
    if constexpr (on_ps) {
      std::vector<embedding::table_spec> specs = tables_;
      specs.push_back({"dense", dense_rows_, options_.dense_row});
      map_.emplace(*roles_, specs, options_.partition);
      servers_.resize(static_cast<std::size_t>(roles_->servers()));
      for (int s = 0; s < roles_->servers(); ++s) {
        if (!is_local(roles_->server_rank(s))) continue;
        ps::server_options so;
        so.threads = options_.server_threads;
        so.init = init();
        servers_[static_cast<std::size_t>(s)] = std::make_unique<server_type>(
            *map_, s, optimizer_, dense_optimizer_, tables_.size(), so);
      }
      load_dense_into_servers(probe.parameters(), {});
    }
  }

  /// Trains on `train_set` (evaluating on `eval_set` when given) with every rank as a thread
  /// of one process, and returns the report.
  train_report fit(const data::ctr_dataset& train_set,
                   const data::ctr_dataset* eval_set = nullptr) {
    STRATA_EXPECTS(local_rank_ < 0, "trainer: built for rank ", local_rank_,
                   " of a multi-process world; call fit(transport, train, eval) on every process");
    check_data(train_set);
    comm::world_options wo;
    wo.timeout_seconds = options_.timeout_seconds;
    wo.link = options_.link;
    wo.send_delay_seconds = options_.send_delay_seconds;
    if (options_.fail_rank >= 0 && options_.fail_on_send > 0) {
      STRATA_EXPECTS(options_.fail_rank < ranks(), "trainer: fail_rank ", options_.fail_rank,
                     " outside the ", ranks(), " ranks");
      wo.fail_on_send.assign(static_cast<std::size_t>(ranks()), 0);
      wo.fail_on_send[static_cast<std::size_t>(options_.fail_rank)] = options_.fail_on_send;
    }
    comm::thread_world world(ranks(), wo);
    stopwatch clock;
    outcome result;
    world.run([&](comm::thread_transport& t) {
      if constexpr (std::is_same_v<Transport, comm::thread_transport>) {
        run_rank(t, train_set, eval_set, result);
      } else {
        Transport endpoint(t);
        run_rank(endpoint, train_set, eval_set, result);
      }
    });
    train_report report = make_report(result, clock.seconds());
    count_bytes(world, report);
    report.embedding_checksum = embedding_checksum();
    return report;
  }

  /// Trains this process's rank of a multi-process world (every process calls it with its own
  /// endpoint; the trainer must have been built with `local_rank = t.rank()`). Rank 0's report
  /// holds the evaluations and checksums; byte counts are this rank's own.
  train_report fit(Transport& t, const data::ctr_dataset& train_set,
                   const data::ctr_dataset* eval_set = nullptr) {
    STRATA_EXPECTS(local_rank_ == t.rank(), "trainer: built for local rank ", local_rank_,
                   " but fit() runs on rank ", t.rank());
    STRATA_EXPECTS(t.size() == ranks(), "trainer: the world has ", t.size(), " ranks but this ",
                   "configuration needs ", ranks(), " (", options_.workers, " workers",
                   on_ps ? cat(" + ", roles_->servers(), " servers") : std::string(), ")");
    check_data(train_set);
    stopwatch clock;
    outcome result;
    run_rank(t, train_set, eval_set, result);
    train_report report = make_report(result, clock.seconds());
    for (int peer = 0; peer < t.size(); ++peer) {
      report.bytes_worker_to_worker += t.bytes_sent_to(peer);
    }
    // Embedding checksum: every rank's share summed on rank 0 (a wrapping sum, order-free).
    std::uint64_t partial = embedding_checksum();
    if (t.rank() == 0) {
      for (int peer = 1; peer < t.size(); ++peer) {
        std::uint64_t theirs = 0;
        t.recv(peer, checksum_tag, std::as_writable_bytes(std::span(&theirs, 1)));
        partial += theirs;
      }
    } else {
      t.send(0, checksum_tag, std::as_bytes(std::span(&partial, 1)));
    }
    report.embedding_checksum = partial;
    return report;
  }

  /// The final dense parameters (worker 0's replica, which under parameter_server pulls them
  /// from the servers at the end of every segment); empty when worker 0 is not in this process.
  [[nodiscard]] std::vector<float> dense_parameters() const {
    if (!workers_[0]) return {};
    const auto p = workers_[0]->model.parameters();
    return {p.begin(), p.end()};
  }
  /// Calls fn(table, key, row, state) for every embedding row (worker 0's replica or the servers).
  template <class Fn>
  void for_each_embedding_row(Fn&& fn) const {
    if constexpr (on_ps) {
      for (const auto& s : servers_)
        if (s)
          s->for_each_row([&](std::size_t t, std::uint64_t key, std::span<const float> row,
                              std::span<const float> state) {
            if (t < tables_.size()) fn(t, key, row, state);
          });
    } else {
      if (!workers_[0]) return;
      const auto& storage = *workers_[0]->tables;
      for (std::size_t t = 0; t < tables_.size(); ++t)
        storage.for_each_row(t, [&](std::uint64_t key, std::span<const float> row,
                                    std::span<const float> state) { fn(t, key, row, state); });
    }
  }
  /// Order- and placement-independent checksum of every row that training changed (rows still
  /// at their initial value are skipped: a PS holds only rows it served, a local table all).
  [[nodiscard]] std::uint64_t embedding_checksum() const {
    std::uint64_t sum = 0;
    const auto initial = init();
    std::vector<float> fresh;
    for_each_embedding_row([&](std::size_t t, std::uint64_t key, std::span<const float> row,
                               std::span<const float> state) {
      fresh.resize(row.size());
      initial.fill(t, key, fresh);
      const bool untouched =
          std::equal(row.begin(), row.end(), fresh.begin()) &&
          std::all_of(state.begin(), state.end(), [](float v) { return v == 0.0f; });
      if (!untouched) sum += detail::row_hash(t, key, row);
    });
    return sum;
  }
  [[nodiscard]] const std::vector<embedding::table_spec>& tables() const noexcept {
    return tables_;
  }
  [[nodiscard]] const trainer_options& options() const noexcept { return options_; }
  [[nodiscard]] int ranks() const noexcept { return on_ps ? roles_->ranks() : options_.workers; }

 private:
  using server_type =
      ps::server<optimizer_type, consistency_type, wire_codec_type, dense_optimizer_type>;
  using dense_codec_type = Compressor;
  static constexpr comm::tag_t checksum_tag = comm::reserved_tag_base + 0x300;

  /// What rank 0 learns during a run (filled on the thread/process that hosts worker 0).
  struct outcome {
    std::size_t first_step = 0, steps = 0;
    std::vector<eval_point> evals;
  };

  [[nodiscard]] bool is_local(int rank) const noexcept {
    return local_rank_ < 0 || rank == local_rank_;
  }
  [[nodiscard]] int rank_of_worker(int w) const { return on_ps ? roles_->worker_rank(w) : w; }
  [[nodiscard]] std::size_t total_steps(const data::ctr_dataset& train_set) const {
    const std::size_t global = options_.batch * static_cast<std::size_t>(options_.workers);
    const std::size_t per_epoch = train_set.size() / global;
    std::size_t total = per_epoch * options_.epochs;
    if (options_.max_steps != 0)
      total = std::min(total == 0 ? options_.max_steps : total, options_.max_steps);
    return total;
  }
  void check_data(const data::ctr_dataset& train_set) const {
    const Model probe(model_config_);
    STRATA_EXPECTS(train_set.size() >= options_.batch * static_cast<std::size_t>(options_.workers),
                   "trainer: the training set has ", train_set.size(),
                   " samples, fewer than one global batch (", options_.batch, " x ",
                   options_.workers, " workers)");
    STRATA_EXPECTS(train_set.dense_cols() == probe.dense_features() &&
                       train_set.sparse_cols() == sparse_features(),
                   "trainer: the data has ", train_set.dense_cols(), " dense and ",
                   train_set.sparse_cols(), " sparse columns but the model reads ",
                   probe.dense_features(), " and ", sparse_features());
  }

  /// Every rank's whole run: resume, then segments (train → servers restart their clocks →
  /// checkpoint) until the last step.
  template <comm::transport T>
  void run_rank(T& t, const data::ctr_dataset& train_set, const data::ctr_dataset* eval_set,
                outcome& result) {
    const std::size_t total = total_steps(train_set);
    std::size_t step = options_.resume ? load_checkpoint(t.rank(), latest_checkpoint()) : 0;
    const bool hosts_worker0 = t.rank() == rank_of_worker(0);
    if (hosts_worker0) {
      result.first_step = step;
      if (options_.progress) progress_ = std::make_unique<progress>("train", total, "step");
    }
    if (is_worker(t.rank()))
      workers_[static_cast<std::size_t>(worker_index(t.rank()))]->timer.reset();
    while (step < total) {
      std::size_t end = total;
      if (options_.eval_every != 0)
        end = std::min(end, (step / options_.eval_every + 1) * options_.eval_every);
      if (options_.checkpoint_every != 0 && !options_.checkpoint_dir.empty())
        end = std::min(end, (step / options_.checkpoint_every + 1) * options_.checkpoint_every);
      const bool evaluate =
          eval_set != nullptr &&
          (end == total || (options_.eval_every != 0 && end % options_.eval_every == 0));
      if (is_worker(t.rank()))
        workers_[static_cast<std::size_t>(worker_index(t.rank()))]->reset_metrics();
      std::optional<eval_point> evaluated;
      rank_body(t, train_set, step, end, eval_set, evaluate, evaluated);
      if constexpr (on_ps) {
        if (roles_->is_server(t.rank()))
          servers_[static_cast<std::size_t>(roles_->server_index(t.rank()))]->reset_clock();
        // Every server restarts its step count before any worker pulls for the next segment
        // (worker 0 may still be evaluating when the others finish theirs).
        if (end < total) comm::barrier(t);
      }
      if (evaluated) result.evals.push_back(*evaluated);
      step = end;
      if (!options_.checkpoint_dir.empty() &&
          (end == total ||
           (options_.checkpoint_every != 0 && end % options_.checkpoint_every == 0)))
        write_checkpoint(t, step);
    }
    if (hosts_worker0) {
      result.steps = step;
      if (options_.progress && progress_) progress_->finish(cat("loss ", workers_[0]->mean_loss()));
    }
  }

  [[nodiscard]] train_report make_report(const outcome& result, double seconds) const {
    train_report report;
    report.strategy = strategy_name;
    report.workers = options_.workers;
    report.servers = on_ps ? roles_->servers() : 0;
    report.first_step = result.first_step;
    report.steps = result.steps;
    report.evals = result.evals;
    report.seconds = seconds;
    const std::size_t global = options_.batch * static_cast<std::size_t>(options_.workers);
    report.samples = (report.steps - report.first_step) * global;
    report.samples_per_second = seconds > 0 ? static_cast<double>(report.samples) / seconds : 0;
    for (const auto& s : servers_)
      if (s) report.server_stats.push_back(s->stats());
    if (workers_[0]) {
      const auto& w0 = *workers_[0];
      report.train_loss = w0.mean_loss();
      const auto positives = std::count(w0.recent_labels.begin(), w0.recent_labels.end(), 1.0f);
      if (positives > 0 && positives < static_cast<std::ptrdiff_t>(w0.recent_labels.size()))
        report.train_auc = data::auc(w0.recent_logits, w0.recent_labels);
      for (std::size_t p = 0; p < phase_count; ++p)
        report.phase_seconds[p] = w0.timer.seconds(p);
      report.dense_checksum = detail::values_checksum(dense_parameters());
    }
    return report;
  }

  struct worker_state {
    explicit worker_state(const trainer& owner)
        : model(owner.model_config_), dense_state(owner.dense_rows_ * owner.dense_state_floats_) {
      if constexpr (!on_ps) tables.emplace(owner.tables_, owner.optimizer_, owner.init());
      if constexpr (!lossless) {
        if constexpr (compress::positional_compressor<Compressor>)
          codec.emplace(model.parameters().size());
        else
          codec.emplace();
      }
    }
    void reset_metrics() {
      loss_sum = 0;
      loss_count = 0;
      recent_logits.clear();
      recent_labels.clear();
    }
    [[nodiscard]] double mean_loss() const {
      return loss_count == 0 ? 0.0 : loss_sum / static_cast<double>(loss_count);
    }
    Model model;
    std::optional<Storage> tables;          ///< allreduce strategy: this worker's replica
    aligned_buffer<float> dense_state;      ///< optimizer state of the dense rows
    std::optional<dense_codec_type> codec;  ///< dense-gradient compressor (with its residual)
    /// Error-feedback residuals of PS pushes, kept between segments (the client is per segment).
    std::vector<std::uint64_t> push_tables, push_keys;
    std::vector<float> push_values;
    phase_timer<phase_count> timer;
    double loss_sum = 0;
    std::size_t loss_count = 0;
    std::vector<float> recent_logits, recent_labels;
  };

  /// Embedding initialisation: ±embedding_init_scale when set, else DLRM's per-table
  /// ±sqrt(1/rows); tables the model starts at zero (`zero_initialised(t)`) are zero.
  [[nodiscard]] embedding::uniform_init init() const {
    embedding::uniform_init result{options_.seed, options_.embedding_init_scale, {}};
    if (options_.embedding_init_scale <= 0.0f) {
      std::vector<std::uint64_t> rows;
      for (const auto& spec : tables_)
        rows.push_back(spec.rows);
      result = embedding::uniform_init::for_rows(options_.seed, rows);
    }
    if constexpr (requires(const Model& m) {
                    { m.zero_initialised(std::size_t{}) } -> std::convertible_to<bool>;
                  }) {
      result.table_scales.resize(tables_.size(), 0.0f);
      for (std::size_t t = 0; t < tables_.size(); ++t)
        if (zero_tables_[t]) result.table_scales[t] = embedding::uniform_init::zeros;
    }
    return result;
  }
  /// Number of sparse input columns the model reads (from the model, on every process).
  [[nodiscard]] std::size_t sparse_features() const noexcept { return sparse_columns_; }
  /// Column of the batch's keys that feeds table t (the model's input_column).
  [[nodiscard]] std::size_t key_column(std::size_t t) const { return key_columns_[t]; }

  std::optional<ps::layout> make_layout() const {
    if constexpr (on_ps) {
      if (options_.servers == 0) return ps::layout::colocated(options_.workers);
      return ps::layout::dedicated(options_.workers, options_.servers);
    }
    return std::nullopt;
  }
  [[nodiscard]] bool is_worker(int rank) const { return on_ps ? roles_->is_worker(rank) : true; }
  [[nodiscard]] int worker_index(int rank) const {
    return on_ps ? roles_->worker_index(rank) : rank;
  }
  [[nodiscard]] std::vector<int> worker_ranks() const {
    std::vector<int> ranks;
    for (int w = 0; w < options_.workers; ++w)
      ranks.push_back(on_ps ? roles_->worker_rank(w) : w);
    return ranks;
  }

  // ---- one segment on one rank ------------------------------------------------------------

  void rank_body(transport_type& t, const data::ctr_dataset& train_set, std::size_t first,
                 std::size_t end, const data::ctr_dataset* eval_set, bool evaluate,
                 std::optional<eval_point>& evaluated) {
    if constexpr (on_ps) {
      if (roles_->is_server(t.rank())) {
        auto& server = *servers_[static_cast<std::size_t>(roles_->server_index(t.rank()))];
        if (!roles_->is_worker(t.rank())) {
          server.serve(t);
          return;
        }
        // Co-located: serve on a second thread of this rank beside the worker.
        std::exception_ptr server_failure;
        std::thread serving([&] {
          try {
            server.serve(t);
          } catch (...) {
            server_failure = std::current_exception();
          }
        });
        std::exception_ptr worker_failure;
        try {
          worker_body(t, train_set, first, end, eval_set, evaluate, evaluated);
        } catch (...) {
          worker_failure = std::current_exception();
        }
        if (worker_failure) {
          // The world is stopping; the server's blocking receive ends with errc::aborted.
          serving.join();
          std::rethrow_exception(worker_failure);
        }
        serving.join();
        if (server_failure) std::rethrow_exception(server_failure);
        return;
      }
    }
    worker_body(t, train_set, first, end, eval_set, evaluate, evaluated);
  }

  void worker_body(transport_type& t, const data::ctr_dataset& train_set, std::size_t first,
                   std::size_t end, const data::ctr_dataset* eval_set, bool evaluate,
                   std::optional<eval_point>& evaluated) {
    const int w = worker_index(t.rank());
    auto& me = *workers_[static_cast<std::size_t>(w)];
    comm::group<transport_type> peers(t, worker_ranks());
    std::optional<storage_type> remote;
    if constexpr (on_ps) {
      ps::client_options co;
      co.fp16_pulls = options_.fp16_pulls;
      co.error_feedback = error_feedback;
      remote.emplace(t, *map_, co);
      if constexpr (error_feedback) {
        for (std::size_t i = 0, at = 0; i < me.push_keys.size(); ++i) {
          const std::size_t dim = map_->spec(me.push_tables[i]).dim;
          remote->client().restore_residual(
              me.push_tables[i], me.push_keys[i],
              std::span<const float>(me.push_values.data() + at, dim));
          at += dim;
        }
      }
    }
    storage_type& storage = [&]() -> storage_type& {
      if constexpr (on_ps)
        return *remote;
      else
        return *me.tables;
    }();

    const std::size_t global = options_.batch * static_cast<std::size_t>(options_.workers);
    data::sharded_sampler sampler(train_set.size(), static_cast<std::size_t>(options_.workers),
                                  static_cast<std::size_t>(w), global, options_.seed);
    const std::size_t per_epoch = sampler.steps_per_epoch();
    step_buffers buffers(*this);
    for (std::size_t s = first; s < end; ++s) {
      if (sampler.epoch() != s / per_epoch || s == first) sampler.set_epoch(s / per_epoch);
      me.timer.skip();
      train_set.gather(sampler.batch(s % per_epoch), buffers.batch);
      me.timer.mark(data_phase);
      train_step(me, storage, peers, buffers, global);
      if (w == 0 && options_.progress) {
        progress_->update(s + 1, cat("loss ", me.mean_loss(), "  sent ",
                                     comm::total_bytes_sent(t) >> 20, " MiB"));
      }
    }
    if (evaluate && w == 0) evaluated = run_eval(me, storage, buffers, *eval_set, end);
    if constexpr (traits::dense_on_ps) {
      if (w == 0) {  // worker 0's replica mirrors the servers' dense parameters
        storage.gather(tables_.size(), buffers.dense_keys, buffers.dense_padded.view());
        auto params = me.model.parameters();
        std::copy_n(buffers.dense_padded.data(), params.size(), params.begin());
      }
    }
    if constexpr (on_ps) {
      if constexpr (error_feedback) {
        me.push_tables.clear();
        me.push_keys.clear();
        me.push_values.clear();
        remote->client().for_each_residual(
            [&](std::size_t table, std::uint64_t key, std::span<const float> values) {
              me.push_tables.push_back(table);
              me.push_keys.push_back(key);
              me.push_values.insert(me.push_values.end(), values.begin(), values.end());
            });
      }
      remote->shutdown();
    }
  }

  /// Scratch reused across steps (no allocation in the step loop after the first step).
  struct step_buffers {
    explicit step_buffers(const trainer& owner) {
      const std::size_t n = owner.tables_.size();
      keys.resize(n);
      rows.resize(n);
      row_grads.resize(n);
      inputs.resize(n);
      grad_views.resize(n);
      dense_keys.resize(owner.dense_rows_);
      std::iota(dense_keys.begin(), dense_keys.end(), std::uint64_t{0});
      dense_padded = matrix<float>(owner.dense_rows_, owner.options_.dense_row);
      dense_grad_row.resize(owner.options_.dense_row);
      dense_state_row.resize(owner.dense_state_floats_);
    }
    data::ctr_batch batch;
    std::vector<std::vector<std::uint64_t>> keys;
    std::vector<matrix<float>> rows, row_grads;
    std::vector<matrix_view<const float>> inputs;
    std::vector<matrix_view<float>> grad_views;
    std::vector<float> logits, dlogits;
    std::vector<std::uint64_t> dense_keys;
    matrix<float> dense_padded;
    std::vector<float> dense_grad_row;  ///< the last, padded dense row's gradient
    std::vector<float> dense_state_row;
    std::vector<std::byte> blob;
    optim::sparse_gradient dedup;
    std::vector<ps::table_pull> pulls;  ///< PS strategies: every table's pull of one step
    std::vector<ps::table_push> pushes;
  };

  /// Gathers embedding rows (and, for parameter_server, the dense parameters) for `batch`.
  void fetch(worker_state& me, storage_type& storage, step_buffers& b) {
    const std::size_t n = b.batch.size();
    // On parameter servers every table (and the dense table) is pulled in one multi-table
    // call: one pipelined round trip per step instead of one per table, the same rows.
    auto& pulls = b.pulls;
    pulls.clear();
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      auto& keys = b.keys[t];
      keys.resize(n);
      const std::size_t column = key_column(t);
      for (std::size_t i = 0; i < n; ++i)
        keys[i] = b.batch.keys(i, column);
      if (b.rows[t].rows() != n) {
        b.rows[t] = matrix<float>(n, tables_[t].dim);
        b.row_grads[t] = matrix<float>(n, tables_[t].dim);
      }
      if constexpr (on_ps)
        pulls.push_back({t, keys, b.rows[t].view()});
      else
        storage.gather(t, keys, b.rows[t].view());
      b.inputs[t] = b.rows[t].view();
      b.grad_views[t] = b.row_grads[t].view();
    }
    if constexpr (traits::dense_on_ps)
      pulls.push_back({tables_.size(), b.dense_keys, b.dense_padded.view()});
    if constexpr (on_ps) storage.gather_tables(pulls);
    if constexpr (traits::dense_on_ps) {
      auto params = me.model.parameters();
      std::copy_n(b.dense_padded.data(), params.size(), params.begin());
    }
  }

  void train_step(worker_state& me, storage_type& storage, comm::group<transport_type>& peers,
                  step_buffers& b, std::size_t global) {
    const std::size_t n = b.batch.size();
    fetch(me, storage, b);
    me.timer.mark(pull_phase);

    b.logits.resize(n);
    b.dlogits.resize(n);
    const models::ctr_inputs inputs{b.batch.dense.view(), b.inputs};
    me.model.forward(inputs, b.logits);
    const double loss = nn::bce_with_logits(b.logits, b.batch.labels, b.dlogits,
                                            1.0f / static_cast<float>(global), nn::reduction::sum);
    me.model.backward(b.dlogits, b.grad_views);
    me.loss_sum += loss;
    me.loss_count += n;
    me.recent_logits.insert(me.recent_logits.end(), b.logits.begin(), b.logits.end());
    me.recent_labels.insert(me.recent_labels.end(), b.batch.labels.begin(), b.batch.labels.end());
    me.timer.mark(compute_phase);

    auto grads = me.model.gradients();
    if constexpr (traits::dense_on_ps) {
      std::copy(grads.begin(), grads.end(), b.dense_padded.data());
      std::fill(b.dense_padded.data() + grads.size(), b.dense_padded.data() + b.dense_padded.size(),
                0.0f);
      storage.apply_gradients(tables_.size(), b.dense_keys, b.dense_padded.view());
      me.timer.mark(push_phase);
    } else {
      sum_dense(me, peers, grads);
      me.timer.mark(allreduce_phase);
      apply_dense(me, b);
      me.timer.mark(compute_phase);
    }

    if constexpr (on_ps) {
      auto& pushes = b.pushes;  // one multi-table push
      pushes.clear();
      for (std::size_t t = 0; t < tables_.size(); ++t)
        pushes.push_back({t, b.keys[t], b.row_grads[t].view()});
      storage.apply_gradients_tables(pushes);
      me.timer.mark(push_phase);
    } else {
      exchange_sparse(storage, peers, b);
      me.timer.mark(allreduce_phase);
    }
  }

  /// Dense gradients summed over workers (in rank order when deterministic).
  void sum_dense(worker_state& me, comm::group<transport_type>& peers, std::span<float> grads) {
    if constexpr (!lossless) {
      compress::compressed_allreduce(peers, grads, *me.codec);
    } else {
      if (options_.deterministic)
        detail::ordered_allreduce(peers, grads);
      else
        comm::allreduce(peers, grads);
    }
  }

  /// The storage's optimizer on the dense parameters, row by row (the same function a server
  /// applies to the dense table under parameter_server).
  void apply_dense(worker_state& me, step_buffers& b) {
    auto params = me.model.parameters();
    auto grads = me.model.gradients();
    const std::size_t d = options_.dense_row;
    const std::size_t sf = dense_state_floats_;
    const std::size_t full = dense_count_ / d;
    // Rows are independent: tbb-parallel in blocks of ≥ 32 K floats (same result, any order).
    const auto state = me.dense_state.span();
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, full, std::max<std::size_t>(1, 32768 / d)),
                      [&](const tbb::blocked_range<std::size_t>& rows) {
                        for (std::size_t r = rows.begin(); r < rows.end(); ++r)
                          dense_optimizer_.apply(params.subspan(r * d, d),
                                                 state.subspan(r * sf, sf),
                                                 grads.subspan(r * d, d));
                      });
    if (full < dense_rows_) {  // the last, padded row
      auto row = b.dense_padded.row(0);
      std::vector<float>& g = b.dense_grad_row;
      const std::size_t left = dense_count_ - full * d;
      std::fill(g.begin(), g.end(), 0.0f);
      std::fill(row.begin(), row.end(), 0.0f);
      std::copy_n(params.begin() + static_cast<std::ptrdiff_t>(full * d), left, row.begin());
      std::copy_n(grads.begin() + static_cast<std::ptrdiff_t>(full * d), left, g.begin());
      dense_optimizer_.apply(row, me.dense_state.span().subspan(full * sf, sf), g);
      std::copy_n(row.begin(), left, params.begin() + static_cast<std::ptrdiff_t>(full * d));
    }
  }

  /// Allreduce strategy: every worker's summed row gradients reach every replica, and each
  /// replica applies them in rank order (so replicas stay bitwise identical).
  void exchange_sparse(storage_type& storage, comm::group<transport_type>& peers, step_buffers& b) {
    if (peers.size() == 1) {  // nothing to exchange: the same sums, applied in place
      for (std::size_t t = 0; t < tables_.size(); ++t)
        storage.apply_gradients(t, b.keys[t], b.row_grads[t].view());
      return;
    }
    b.blob.clear();
    detail::blob_writer out{b.blob};
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      b.dedup.sum_duplicates(b.keys[t], b.row_grads[t].view());
      out.put_value<std::uint64_t>(b.dedup.size());
      out.put(b.dedup.keys());
      const auto g = b.dedup.grads();
      out.put(std::span<const float>(g.data(), g.rows() * g.cols()));
      // Keep the next table's 8-byte count and keys 8-byte aligned (an odd number of floats,
      // e.g. a dim-1 wide table, would misalign them).
      if ((g.rows() * g.cols()) % 2 != 0) out.put_value<float>(0.0f);
    }
    const auto all = detail::allgatherv(peers, b.blob);
    std::vector<detail::blob_reader> readers;
    for (const auto& blob : all)
      readers.push_back({blob});
    std::vector<std::uint64_t> keys;
    std::vector<float> grads;
    for (std::size_t t = 0; t < tables_.size(); ++t) {
      const std::size_t dim = tables_[t].dim;
      keys.clear();
      grads.clear();
      for (auto& r : readers) {
        const auto count = r.take<std::uint64_t>(1)[0];
        const auto k = r.take<std::uint64_t>(count);
        const auto g = r.take<float>(count * dim);
        if ((count * dim) % 2 != 0) (void)r.take<float>(1);  // the writer's alignment pad
        keys.insert(keys.end(), k.begin(), k.end());
        grads.insert(grads.end(), g.begin(), g.end());
      }
      storage.apply_gradients(t, keys, matrix_view<const float>(grads.data(), keys.size(), dim));
    }
  }

  eval_point run_eval(worker_state& me, storage_type& storage, step_buffers& b,
                      const data::ctr_dataset& eval_set, std::size_t at_step) {
    std::size_t count = eval_set.size();
    if (options_.eval_max_samples != 0) count = std::min(count, options_.eval_max_samples);
    std::vector<float> logits, labels;
    logits.reserve(count);
    labels.reserve(count);
    std::vector<std::size_t> indices;
    for (std::size_t first = 0; first < count; first += options_.batch) {
      const std::size_t n = std::min(options_.batch, count - first);
      indices.resize(n);
      std::iota(indices.begin(), indices.end(), first);
      eval_set.gather(indices, b.batch);
      fetch(me, storage, b);
      b.logits.resize(n);
      me.model.forward(models::ctr_inputs{b.batch.dense.view(), b.inputs}, b.logits);
      logits.insert(logits.end(), b.logits.begin(), b.logits.end());
      labels.insert(labels.end(), b.batch.labels.begin(), b.batch.labels.end());
    }
    eval_point point;
    point.step = at_step;
    point.samples = count;
    std::vector<float> probs(logits.size());
    std::transform(logits.begin(), logits.end(), probs.begin(),
                   [](float l) { return 1.0f / (1.0f + std::exp(-l)); });
    const auto positives = std::count(labels.begin(), labels.end(), 1.0f);
    point.auc = positives > 0 && positives < static_cast<std::ptrdiff_t>(labels.size())
                    ? data::auc(logits, labels)
                    : 0.5;
    point.logloss = data::logloss_from_logits(logits, labels);
    point.accuracy = data::accuracy(probs, labels);
    log_line(cat("eval @ step ", at_step, ": auc ", point.auc, " logloss ", point.logloss,
                 " accuracy ", point.accuracy, " (", count, " samples)"));
    return point;
  }

  // ---- dense table on the servers -----------------------------------------------------------

  /// Writes dense parameters (and optimizer state, if given) into the servers' dense table.
  void load_dense_into_servers(std::span<const float> params, std::span<const float> state) {
    if constexpr (traits::dense_on_ps) {
      const std::size_t d = options_.dense_row, sf = dense_state_floats_;
      std::vector<float> row(d), st(sf);
      for (std::size_t r = 0; r < dense_rows_; ++r) {
        std::fill(row.begin(), row.end(), 0.0f);
        const std::size_t first = r * d, n = std::min(d, params.size() - first);
        std::copy_n(params.begin() + static_cast<std::ptrdiff_t>(first), n, row.begin());
        if (state.empty())
          std::fill(st.begin(), st.end(), 0.0f);
        else
          std::copy_n(state.begin() + static_cast<std::ptrdiff_t>(r * sf), sf, st.begin());
        const auto s = map_->server_of(tables_.size(), r);
        if (servers_[s]) servers_[s]->import_row(tables_.size(), r, row, st);
      }
    }
  }
  // ---- traffic ----------------------------------------------------------------------------

  void count_bytes(const comm::thread_world& world, train_report& report) const {
    std::uint64_t ps_requests = 0, ps_replies = 0, total = 0;
    for (const auto& s : servers_) {
      if (!s) continue;
      const auto st = s->stats();
      ps_requests += st.bytes_received;
      ps_replies += st.bytes_sent;
    }
    for (int a = 0; a < world.size(); ++a)
      for (int b = 0; b < world.size(); ++b)
        if (a != b) total += world.bytes_sent(a, b);
    report.bytes_worker_to_server = ps_requests;
    report.bytes_server_to_worker = ps_replies;
    report.bytes_worker_to_worker =
        total >= ps_requests + ps_replies ? total - ps_requests - ps_replies : 0;
  }

  // ---- checkpoints ------------------------------------------------------------------------

  [[nodiscard]] std::filesystem::path latest_checkpoint() const {
    const auto& dir = options_.checkpoint_dir;
    if (std::filesystem::exists(dir / "state.ckpt")) return dir;  // a specific checkpoint
    std::ifstream latest(dir / "latest");
    std::string name;
    if (!(latest >> name))
      fail(errc::io_error, cat("trainer: no checkpoint to resume from in ", dir.string(),
                               " (no 'latest' file); train without --resume first"));
    return dir / name;
  }

  /// Rows of every table this rank holds, plus the dense table (index tables_.size()), as
  /// (key, row, state) records: the placement-free form every strategy can load.
  void write_rows(const std::filesystem::path& file, bool with_embeddings, bool with_dense_replica,
                  const server_type* server) const {
    const std::size_t count = tables_.size() + 1;
    std::vector<std::vector<std::uint64_t>> keys(count);
    std::vector<std::vector<float>> values(count), states(count);
    const auto add = [&](std::size_t t, std::uint64_t key, std::span<const float> row,
                         std::span<const float> st) {
      keys[t].push_back(key);
      values[t].insert(values[t].end(), row.begin(), row.end());
      states[t].insert(states[t].end(), st.begin(), st.end());
    };
    if (server != nullptr) server->for_each_row(add);
    if constexpr (!on_ps) {
      if (with_embeddings)
        for (std::size_t t = 0; t < tables_.size(); ++t)
          workers_[0]->tables->for_each_row(
              t, [&](std::uint64_t key, std::span<const float> row, std::span<const float> st) {
                add(t, key, row, st);
              });
    }
    if (with_dense_replica) {
      const auto params = workers_[0]->model.parameters();
      const std::size_t d = options_.dense_row, sf = dense_state_floats_;
      std::vector<float> row(d);
      for (std::size_t r = 0; r < dense_rows_; ++r) {
        std::fill(row.begin(), row.end(), 0.0f);
        const std::size_t first = r * d, n = std::min(d, params.size() - first);
        std::copy_n(params.begin() + static_cast<std::ptrdiff_t>(first), n, row.begin());
        add(tables_.size(), r, row, workers_[0]->dense_state.span().subspan(r * sf, sf));
      }
    }
    checkpoint_writer out;
    const std::uint64_t table_count = count;
    out.add_value("tables", table_count);
    for (std::size_t t = 0; t < count; ++t) {
      out.add_values<std::uint64_t>(cat("t", t, "/keys"), keys[t]);
      out.add_values<float>(cat("t", t, "/rows"), values[t]);
      out.add_values<float>(cat("t", t, "/state"), states[t]);
    }
    out.commit(file);
  }

  /// Every rank writes what it holds into step-N.tmp/, then rank 0 renames the directory and
  /// points `latest` at it (barriers in between, so a checkpoint is whole or absent).
  template <comm::transport T>
  void write_checkpoint(T& t, std::size_t step) const {
    namespace fs = std::filesystem;
    const fs::path dir = options_.checkpoint_dir;
    const std::string name = cat("step-", step);
    const fs::path temporary = dir / (name + ".tmp"), final_dir = dir / name;
    if (t.rank() == 0) {
      fs::create_directories(dir);
      fs::remove_all(temporary);
      fs::create_directories(temporary);
    }
    comm::barrier(t);
    if (t.rank() == rank_of_worker(0)) {
      checkpoint_writer state;
      const std::uint64_t at = step, dense_count = dense_count_, dense_row = options_.dense_row;
      state.add_value("meta/step", at);
      state.add_value("meta/dense_count", dense_count);
      state.add_value("meta/dense_row", dense_row);
      state.add_value("meta/seed", options_.seed);
      state.add_value("meta/workers", options_.workers);
      const std::string opt_name = optimizer_type::name;
      state.add("meta/optimizer", std::as_bytes(std::span(opt_name)));
      const std::string dense_opt_name = dense_optimizer_type::name;
      state.add("meta/dense_optimizer", std::as_bytes(std::span(dense_opt_name)));
      const std::string strategy = strategy_name;
      state.add("meta/strategy", std::as_bytes(std::span(strategy)));
      state.commit(temporary / "state.ckpt");
      if constexpr (!traits::dense_on_ps)
        write_rows(temporary / "rows-worker-0.ckpt", !on_ps, true, nullptr);
    }
    if (is_worker(t.rank())) {
      const int w = worker_index(t.rank());
      if constexpr (!lossless &&
                    (compress::positional_compressor<Compressor> || (on_ps && error_feedback))) {
        const auto& me = *workers_[static_cast<std::size_t>(w)];
        checkpoint_writer residual;
        if constexpr (compress::positional_compressor<Compressor>)
          residual.add_values<float>("residual", me.codec->residual());
        residual.add_values<std::uint64_t>("push/tables", me.push_tables);
        residual.add_values<std::uint64_t>("push/keys", me.push_keys);
        residual.add_values<float>("push/values", me.push_values);
        residual.commit(temporary / cat("worker-", w, ".ckpt"));
      }
    }
    if constexpr (on_ps) {
      if (roles_->is_server(t.rank())) {
        const int s = roles_->server_index(t.rank());
        write_rows(temporary / cat("rows-server-", s, ".ckpt"), false, false,
                   servers_[static_cast<std::size_t>(s)].get());
      }
    }
    comm::barrier(t);
    if (t.rank() == 0) {
      fs::remove_all(final_dir);
      fs::rename(temporary, final_dir);
      {
        std::ofstream latest(dir / "latest.tmp", std::ios::trunc);
        latest << name << "\n";
      }
      fs::rename(dir / "latest.tmp", dir / "latest");
      std::vector<std::pair<std::size_t, fs::path>> found;  // keep the two newest
      for (const auto& entry : fs::directory_iterator(dir)) {
        const auto file = entry.path().filename().string();
        if (entry.is_directory() && file.rfind("step-", 0) == 0 &&
            file.find(".tmp") == std::string::npos)
          found.emplace_back(std::stoull(file.substr(5)), entry.path());
      }
      std::sort(found.begin(), found.end());
      for (std::size_t i = 0; i + 2 < found.size(); ++i)
        fs::remove_all(found[i].second);
    }
    comm::barrier(t);
  }

  /// Loads what `rank` holds from a checkpoint written under any strategy and world size;
  /// returns its step.
  std::size_t load_checkpoint(int rank, const std::filesystem::path& dir) {
    namespace fs = std::filesystem;
    const checkpoint_reader state(dir / "state.ckpt");
    const auto dense_count = state.value<std::uint64_t>("meta/dense_count");
    const auto dense_row = state.value<std::uint64_t>("meta/dense_row");
    const auto opt = state.bytes("meta/optimizer");
    const std::string opt_name(reinterpret_cast<const char*>(opt.data()), opt.size());
    if (dense_count != dense_count_)
      fail(errc::corrupt_data, cat("checkpoint ", dir.string(), " holds ", dense_count,
                                   " dense parameters but this model has ", dense_count_,
                                   "; was it written for another model configuration?"));
    // Checkpoints from before per-part optimizers have no meta/dense_optimizer: the tables'.
    std::string dense_opt_name = opt_name;
    if (state.has("meta/dense_optimizer")) {
      const auto dense_opt = state.bytes("meta/dense_optimizer");
      dense_opt_name.assign(reinterpret_cast<const char*>(dense_opt.data()), dense_opt.size());
    }
    if (opt_name != optimizer_type::name || dense_opt_name != dense_optimizer_type::name ||
        dense_row != options_.dense_row)
      fail(errc::corrupt_data,
           cat("checkpoint ", dir.string(), " was written with optimizers ", opt_name,
               " (tables) and ", dense_opt_name, " (dense) and dense_row ", dense_row,
               "; this run uses ", optimizer_type::name, ", ", dense_optimizer_type::name, " and ",
               options_.dense_row, ": resume with the optimizers it was written with"));
    worker_state* me =
        is_worker(rank) ? workers_[static_cast<std::size_t>(worker_index(rank))].get() : nullptr;
    server_type* server = nullptr;
    if constexpr (on_ps)
      if (roles_->is_server(rank))
        server = servers_[static_cast<std::size_t>(roles_->server_index(rank))].get();

    std::vector<fs::path> files;
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.path().filename().string().rfind("rows-", 0) == 0) files.push_back(entry.path());
    std::sort(files.begin(), files.end());
    if (files.empty())
      fail(errc::corrupt_data, cat("checkpoint ", dir.string(), " has no rows-*.ckpt files"));
    std::size_t dense_seen = 0;
    for (const auto& file : files) {
      const checkpoint_reader rows(file);
      if (rows.value<std::uint64_t>("tables") != tables_.size() + 1)
        fail(errc::corrupt_data,
             cat("checkpoint ", file.string(), " has ", rows.value<std::uint64_t>("tables") - 1,
                 " embedding tables but the model has ", tables_.size()));
      for (std::size_t t = 0; t <= tables_.size(); ++t) {
        const bool dense = t == tables_.size();
        const std::size_t dim = dense ? options_.dense_row : tables_[t].dim;
        const std::size_t sf = dense ? dense_state_floats_ : optimizer_type::state_floats(dim);
        const auto keys = rows.values<std::uint64_t>(cat("t", t, "/keys"));
        const auto values = rows.values<float>(cat("t", t, "/rows"), keys.size() * dim);
        const auto st = rows.values<float>(cat("t", t, "/state"), keys.size() * sf);
        for (std::size_t i = 0; i < keys.size(); ++i) {
          const auto row = std::span<const float>(values.data() + i * dim, dim);
          const auto row_state = std::span<const float>(st.data() + i * sf, sf);
          const bool to_servers = dense ? traits::dense_on_ps : on_ps;
          if (to_servers) {
            if constexpr (on_ps)
              if (server != nullptr &&
                  map_->server_of(t, keys[i]) == static_cast<std::size_t>(server->index()))
                server->import_row(t, keys[i], row, row_state);
          }
          // Workers keep a replica of the dense parameters under every strategy.
          if (me != nullptr && (dense || !to_servers)) {
            if (dense) {
              if (keys[i] >= dense_rows_)
                fail(errc::corrupt_data, cat("checkpoint ", file.string(), ": dense row ", keys[i],
                                             " outside the model's ", dense_rows_, " rows"));
              auto params = me->model.parameters();
              const std::size_t first = keys[i] * dim, n = std::min(dim, params.size() - first);
              std::copy_n(row.begin(), n, params.begin() + static_cast<std::ptrdiff_t>(first));
              if (!traits::dense_on_ps)
                std::copy(row_state.begin(), row_state.end(),
                          me->dense_state.begin() + static_cast<std::ptrdiff_t>(keys[i] * sf));
              ++dense_seen;
            } else if constexpr (!on_ps) {
              auto target = me->tables->row(t, keys[i]);
              std::copy(row.begin(), row.end(), target.begin());
              auto target_state = me->tables->state(t, keys[i]);
              std::copy(row_state.begin(), row_state.end(), target_state.begin());
            }
          }
        }
      }
    }
    if (me != nullptr && dense_seen != dense_rows_)
      fail(errc::corrupt_data, cat("checkpoint ", dir.string(), " holds ", dense_seen, " of the ",
                                   dense_rows_, " dense parameter rows"));
    if constexpr (!lossless) {
      if (me != nullptr) {
        // Residuals belong to a worker; they carry over only when the worker count matches.
        const auto file = dir / cat("worker-", worker_index(rank), ".ckpt");
        std::optional<checkpoint_reader> saved;
        if (state.value<int>("meta/workers") == options_.workers && fs::exists(file))
          saved.emplace(file);
        if constexpr (compress::positional_compressor<Compressor>) {
          if (saved && saved->has("residual"))
            me->codec->restore_residual(saved->values<float>("residual", dense_count_));
          else
            me->codec->reset();
        }
        me->push_tables.clear();
        me->push_keys.clear();
        me->push_values.clear();
        if constexpr (on_ps && error_feedback) {
          if (saved && saved->has("push/keys")) {
            me->push_tables = saved->values<std::uint64_t>("push/tables");
            me->push_keys = saved->values<std::uint64_t>("push/keys", me->push_tables.size());
            std::size_t floats = 0;
            for (auto t : me->push_tables) {
              if (t >= map_->table_count())
                fail(errc::corrupt_data, cat("checkpoint ", file.string(), ": residual of table ",
                                             t, " outside the ", map_->table_count(), " tables"));
              floats += map_->spec(t).dim;
            }
            me->push_values = saved->values<float>("push/values", floats);
          }
        }
      }
    }
    const auto step = state.value<std::uint64_t>("meta/step");
    if (rank == 0) log_line(cat("resumed from ", dir.string(), " at step ", step));
    return static_cast<std::size_t>(step);
  }

  typename Model::config model_config_;
  optimizer_type optimizer_;
  dense_optimizer_type dense_optimizer_;
  trainer_options options_;
  std::vector<embedding::table_spec> tables_;
  std::size_t sparse_columns_ = 0;        ///< the model's sparse_features()
  std::vector<std::size_t> key_columns_;  ///< key_columns_[t]: the model's input_column(t)
  std::vector<bool> zero_tables_;         ///< the model's zero_initialised(t), when it says
  std::size_t dense_count_ = 0, dense_rows_ = 0, dense_state_floats_ = 0;
  std::optional<ps::layout> roles_;
  std::optional<ps::shard_map> map_;
  std::vector<std::unique_ptr<worker_state>> workers_;
  std::vector<std::unique_ptr<server_type>> servers_;
  std::unique_ptr<progress> progress_;
  int local_rank_ = -1;
};

}  // namespace strata::train

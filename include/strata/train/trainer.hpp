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
/// One step on worker w (global step s), as `worker_body` and `train_step` make the calls:
/// ```
/// load(s)                       its slice of global batch s (data::sharded_sampler)
/// sparse.fetch(pulls)           the rows of every table (gather, or PS pull; split-phase)
/// model.forward / backward      logits, loss, dense and row gradients
/// guard_divergence              nothing non-finite leaves the worker (divergence_guard.hpp)
/// sparse.apply(pushes)          row gradients: all-gathered and applied to every replica, or
///                               pushed to the servers (which also take the dense ones under
///                               parameter_server: dense.push)
/// dense.sum(peers, grads)       the dense gradients over the workers (allreduce_dense)
/// dense.apply(params, grads)    DenseOptimizer on the dense parameters
/// ```
/// The parts come from `trainer_composition` (composition.hpp: dense path, sparse path,
/// storage, codecs, the compile-time checks). Around the steps: training runs in segments
/// between evaluations (evaluation.hpp) and checkpoints (run_checkpoints.hpp; at a segment
/// boundary every rank is idle, so a checkpoint captures one consistent state); the servers
/// and their threads live in servers.hpp, the world's launch options in launch.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/group.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/compress/concepts.hpp"
#include "strata/compress/identity.hpp"
#include "strata/core/error.hpp"
#include "strata/core/progress.hpp"
#include "strata/core/timer.hpp"
#include "strata/core/trace.hpp"
#include "strata/data/batch.hpp"
#include "strata/data/sampler.hpp"
#include "strata/data/source.hpp"
#include "strata/embedding/concepts.hpp"
#include "strata/embedding/init.hpp"
#include "strata/models/concepts.hpp"
#include "strata/nn/loss.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/ps/layout.hpp"
#include "strata/ps/partition.hpp"
#include "strata/train/checkpoint_rows.hpp"
#include "strata/train/composition.hpp"
#include "strata/train/divergence_guard.hpp"
#include "strata/train/evaluation.hpp"
#include "strata/train/launch.hpp"
#include "strata/train/options.hpp"
#include "strata/train/run_checkpoints.hpp"
#include "strata/train/servers.hpp"
#include "strata/train/strategy.hpp"

namespace strata::train {

/// The CTR trainer. Model: a `models::ctr_model`; Storage: `embedding::local<Opt>` /
/// `embedding::hash_table<Opt>` (ring_allreduce) or `embedding::sharded<Opt>` (PS strategies);
/// Communicator: `comm::ring_allreduce`, `parameter_server<Consistency>` or
/// `hybrid<Consistency>`; Compressor: a `compress::compressor` for dense gradients and PS
/// pushes (`error_feedback<C>` keeps residuals on the workers), or `compress::per_path<Dense,
/// Push>` for a codec per path (hybrid: the dense allreduce's and the pushes').
///
/// Optimizers per part: the Storage's optimizer updates the embedding rows; DenseOptimizer
/// (any `optim::sparse_optimizer`, by default the Storage's) updates the dense parameters, cut
/// into rows of `dense_row` values — e.g. Adagrad for the tables and Adam for the MLP,
/// as DLRM and TorchRec users train. Every strategy applies the very same functions to the same
/// sums (under `parameter_server` the servers apply DenseOptimizer to the dense table).
/// Not thread-safe; `fit` runs the whole world on threads.
template <models::ctr_model Model, class Storage, communicator Communicator,
          compress::trainer_compressor Compressor = compress::identity,
          comm::transport Transport = comm::thread_transport,
          optim::sparse_optimizer DenseOptimizer =
              optim::default_dense_t<typename Storage::optimizer_type>>
class trainer {
  using parts =
      trainer_composition<Model, Storage, Communicator, Compressor, Transport, DenseOptimizer>;
  using traits = typename parts::traits;
  static constexpr bool on_ps = parts::on_ps;
  static constexpr bool foreign_allreduce = parts::foreign_allreduce;
  using workers_endpoint_type = typename parts::workers_endpoint_type;

 public:
  using model_type = Model;
  using optimizer_type = typename parts::optimizer_type;  ///< the embedding tables'
  using dense_optimizer_type = DenseOptimizer;            ///< the dense parameters'
  using consistency_type = typename parts::consistency_type;
  using transport_type = Transport;
  /// The codec of each path (one Compressor for both, or compress::per_path<Dense, Push>).
  using dense_compressor_type = typename parts::dense_compressor_type;
  using push_compressor_type = typename parts::push_compressor_type;
  using wire_codec_type = typename parts::wire_codec_type;
  static constexpr bool error_feedback = parts::error_feedback;
  using storage_type = typename parts::storage_type;
  /// The pushes travel lossless (identity on the wire).
  static constexpr bool lossless = parts::lossless;
  static constexpr const char* strategy_name = parts::strategy_name;
  /// The two acting parts of the Communicator (composition.hpp).
  using dense_path_type = typename parts::dense_path_type;
  using sparse_path_type = typename parts::sparse_path_type;
  /// The next step's pull leaves before this step computes (ps::async), else after its push.
  static constexpr bool prefetch = parts::prefetch;

  /// A trainer for every rank of a `thread_world` (`local_rank` < 0; train with
  /// `fit(train, eval)`), or for one process of a multi-process world such as MPI
  /// (`local_rank` = this process's rank; train with `fit(transport, train, eval)` on every
  /// process: only this rank's worker and server state is built here).
  ///
  /// This form uses `optimizer` for the dense parameters too (DenseOptimizer must then be the
  /// Storage's optimizer).
  ///
  /// `communicator` carries the Communicator's options (e.g. `comm::ring_allreduce{.chunk_bytes
  /// = 64 << 10}`, or `hybrid<C, A>{.dense_allreduce = …}`).
  trainer(typename Model::config model_config, optimizer_type optimizer, trainer_options options,
          int local_rank = -1,
          Communicator communicator = {}) requires std::is_same_v<DenseOptimizer, optimizer_type>
      : trainer(std::move(model_config), optimizer, optimizer, std::move(options), local_rank,
                communicator) {}

  /// As above, with `dense_optimizer` for the dense parameters (the MLPs).
  trainer(typename Model::config model_config, optimizer_type optimizer,
          dense_optimizer_type dense_optimizer, trainer_options options, int local_rank = -1,
          Communicator communicator = {})
      : model_config_(std::move(model_config)),
        optimizer_(optimizer),
        dense_optimizer_(dense_optimizer),
        options_(std::move(options)),
        communicator_(communicator),
        local_rank_(local_rank),
        checkpoints_(options_) {
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
    dense_layout_ = dense_rows(probe.parameters().size(), options_.dense_row);
    roles_ = make_layout();
    traces_.resize(static_cast<std::size_t>(ranks()));
    STRATA_EXPECTS(local_rank_ < ranks(), "trainer: local rank ", local_rank_, " outside the ",
                   ranks(), " ranks of this configuration (", options_.workers, " workers",
                   on_ps ? cat(", ", options_.servers, " servers") : std::string(), ")");
    // Persistent per-worker state (replicas of dense parameters and, for allreduce, tables),
    // built only for the workers that run in this process.
    workers_.resize(static_cast<std::size_t>(options_.workers));
    for (int w = 0; w < options_.workers; ++w)
      if (is_local(w))
        workers_[static_cast<std::size_t>(w)] = std::make_unique<worker_state>(*this, w);
    if constexpr (on_ps) {
      std::vector<embedding::table_spec> specs = tables_;
      specs.push_back({"dense", dense_layout_.rows(), options_.dense_row});
      map_.emplace(*roles_, specs, options_.partition);
      ps::server_options so;
      so.threads = options_.server_threads;
      so.init = init();
      servers_ = hosted_servers<server_type>(
          *map_, [&](int rank) { return is_local(rank); }, optimizer_, dense_optimizer_,
          tables_.size(), so);
      if constexpr (traits::dense_on_ps)  // the dense parameters are the last table's rows
        servers_.import_dense(tables_.size(), dense_layout_, probe.parameters(),
                              dense_state_floats());
    }
  }

  /// Trains on `train_set` (evaluating on `eval_set` when given) with every rank as a thread
  /// of one process, and returns the report.
  train_report fit(const data::example_source& train_set,
                   const data::example_source* eval_set = nullptr) {
    static_assert(!foreign_allreduce,
                  "hybrid<Consistency, mpi::native_allreduce> runs one MPI process per rank: build "
                  "the trainer with local_rank = transport.rank() and call fit(transport, train, "
                  "eval) on every process");
    STRATA_EXPECTS(local_rank_ < 0, "trainer: built for rank ", local_rank_,
                   " of a multi-process world; call fit(transport, train, eval) on every process");
    check_data(train_set);
    check_trace_file(-1);
    const auto lock = checkpoints_.claim();
    comm::thread_world world(ranks(), world_options_for(options_, ranks()));
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
    report.faults_fired = world.faults_fired();
    split_traffic(world, servers_.stats(), report);
    if (!options_.trace_file.empty()) {
      std::vector<const trace_recorder*> tracks;
      for (const auto& r : traces_)
        tracks.push_back(r.get());
      write_trace(trace_path(-1), tracks);
    }
    report.embedding_checksum = embedding_checksum();
    return report;
  }

  /// Trains this process's rank of a multi-process world (every process calls it with its own
  /// endpoint; the trainer must have been built with `local_rank = t.rank()`). Rank 0's report
  /// holds the evaluations and checksums; byte counts are this rank's own.
  train_report fit(Transport& t, const data::example_source& train_set,
                   const data::example_source* eval_set = nullptr) {
    STRATA_EXPECTS(local_rank_ == t.rank(), "trainer: built for local rank ", local_rank_,
                   " but fit() runs on rank ", t.rank());
    STRATA_EXPECTS(t.size() == ranks(), "trainer: the world has ", t.size(), " ranks but this ",
                   "configuration needs ", ranks(), " (", options_.workers, " workers",
                   on_ps ? cat(" + ", roles_->servers(), " servers") : std::string(), ")");
    STRATA_EXPECTS(options_.faults.empty(),
                   "trainer: a fault plan (trainer_options::faults) is carried out by the "
                   "in-process world of fit(train, eval); a multi-process run rehearses a dead "
                   "rank with comm::crash_after (ctr_train --crash-rank/--crash-after-sends/"
                   "--crash-phase)");
    check_data(train_set);
    check_trace_file(t.rank());
    // The process of rank 0 (which publishes checkpoints) holds the directory's lock.
    const auto lock = t.rank() == 0 ? checkpoints_.claim() : std::nullopt;
    // Every rank (servers too) joins the split that gives the workers their own endpoint.
    if constexpr (foreign_allreduce)
      if (!workers_endpoint_) workers_endpoint_ = traits::allreduce::subset(t, is_worker(t.rank()));
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
    if (!options_.trace_file.empty()) {
      const trace_recorder* mine = traces_[static_cast<std::size_t>(t.rank())].get();
      write_trace(trace_path(t.rank()), std::span(&mine, 1), t.rank());
    }
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
      servers_.for_each_row([&](std::size_t t, std::uint64_t key, std::span<const float> row,
                                std::span<const float> state) {
        if (t < tables_.size()) fn(t, key, row, state);  // the dense table is not an embedding
      });
    } else {
      if (!workers_[0]) return;
      const auto& storage = workers_[0]->sparse.storage();
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
  using server_type = typename parts::server_type;
  static constexpr comm::tag_t checksum_tag = comm::tags::report;

  /// What rank 0 learns during a run (filled on the thread/process that hosts worker 0).
  struct outcome {
    std::size_t first_step = 0, steps = 0;
    std::vector<eval_point> evals;
  };

  [[nodiscard]] bool is_local(int rank) const noexcept {
    return local_rank_ < 0 || rank == local_rank_;
  }
  /// How rank `rank` walks the training data.
  [[nodiscard]] data::loader_config loader_config(std::size_t rank) const noexcept {
    return {.world_size = static_cast<std::size_t>(options_.workers),
            .rank = rank,
            .global_batch = options_.batch * static_cast<std::size_t>(options_.workers),
            .seed = options_.seed,
            .data_shards = options_.data_shards,
            .shuffle_window = options_.shuffle_window};
  }
  [[nodiscard]] std::size_t total_steps(const data::example_source& train_set) const {
    const std::size_t per_epoch = train_set.steps_per_epoch(loader_config(0));
    std::size_t total = per_epoch * options_.epochs;
    if (options_.max_steps != 0)
      total = std::min(total == 0 ? options_.max_steps : total, options_.max_steps);
    return total;
  }
  void check_data(const data::example_source& train_set) const {
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
    // A sharded source refuses a layout it cannot deal (more shards than chunks, a batch that
    // is not a multiple of the shards) here, before any rank starts.
    STRATA_EXPECTS(train_set.steps_per_epoch(loader_config(0)) > 0,
                   "trainer: the training set has no whole step of ", options_.batch, " x ",
                   options_.workers, " workers");
  }

  /// Every rank's whole run: resume, then segments (train → servers restart their clocks →
  /// checkpoint) until the last step.
  template <comm::transport T>
  void run_rank(T& t, const data::example_source& train_set, const data::example_source* eval_set,
                outcome& result) {
    const std::size_t total = total_steps(train_set);
    start_trace(t.rank());
    std::size_t step = checkpoints_.resuming() ? load_checkpoint(t.rank()) : 0;
    // Every server holds its checkpointed rows before any worker pulls (in-process pulls read
    // the servers' rows directly, without waiting for a server to answer).
    if constexpr (on_ps)
      if (checkpoints_.resuming()) comm::barrier(t, comm::tags::checkpoint);
    const bool hosts_worker0 = t.rank() == 0;
    if (hosts_worker0) {
      result.first_step = step;
      if (options_.progress) progress_ = std::make_unique<progress>("train", total, "step");
    }
    if (is_worker(t.rank())) workers_[static_cast<std::size_t>(t.rank())]->timer.reset();
    while (step < total) {
      std::size_t end = checkpoints_.segment_end(step, total);
      if (options_.eval_every != 0)
        end = std::min(end, (step / options_.eval_every + 1) * options_.eval_every);
      const bool evaluate =
          eval_set != nullptr &&
          (end == total || (options_.eval_every != 0 && end % options_.eval_every == 0));
      if (is_worker(t.rank())) workers_[static_cast<std::size_t>(t.rank())]->metrics.reset();
      std::optional<eval_point> evaluated;
      rank_body(t, train_set, step, end, eval_set, evaluate, evaluated);
      if constexpr (on_ps) {
        servers_.reset_clock(t.rank());
        // Every server restarts its step count before any worker pulls for the next segment
        // (worker 0 may still be evaluating when the others finish theirs).
        if (end < total) comm::barrier(t);
      }
      if (evaluated) result.evals.push_back(*evaluated);
      step = end;
      if (checkpoints_.due(end, total))
        traced(t.rank(), "checkpoint", [&] { write_checkpoint(t, step); });
    }
    if (hosts_worker0) {
      result.steps = step;
      if (options_.progress && progress_)
        progress_->finish(cat("loss ", workers_[0]->metrics.mean_loss()));
    }
  }

  /// The rank's timeline recorder when tracing (trainer_options::trace_file); its worker's
  /// phase timer records into it.
  void start_trace(int rank) {
    if (options_.trace_file.empty()) return;
    const int servers = on_ps ? roles_->servers() : 0;
    const bool serves = on_ps && roles_->is_server(rank);
    std::string label = is_worker(rank) ? cat("worker ", rank) : std::string();
    if (serves)
      label += cat(label.empty() ? "" : " + ", "server ", roles_->server_index(rank), "/", servers);
    auto& slot = traces_[static_cast<std::size_t>(rank)];
    slot = std::make_unique<trace_recorder>(rank, label);
    if (is_worker(rank))
      workers_[static_cast<std::size_t>(rank)]->timer.trace_into(slot.get(), phase_names);
  }
  /// The trace file: trainer_options::trace_file for a threaded run (`rank` < 0), else rank
  /// `rank`'s <stem>.rank<R><extension> beside it.
  [[nodiscard]] std::filesystem::path trace_path(int rank) const {
    const auto& f = options_.trace_file;
    if (rank < 0) return f;
    return f.parent_path() / cat(f.stem().string(), ".rank", rank, f.extension().string());
  }
  /// Refuses (errc::io_error) a trace file that cannot be written, before training.
  void check_trace_file(int rank) const {
    if (options_.trace_file.empty()) return;
    const auto path = trace_path(rank);
    if (!std::ofstream(path, std::ios::app))
      fail(errc::io_error, cat("trainer: cannot write the trace file ", path.string(),
                               "; does its directory exist and is it writable?"));
  }
  /// Runs `fn`, recorded as a span `name` on the rank's timeline when tracing.
  template <class Fn>
  void traced(int rank, const char* name, Fn&& fn) {
    trace_recorder* trace = traces_[static_cast<std::size_t>(rank)].get();
    const auto begin = trace_recorder::clock::now();
    fn();
    if (trace != nullptr) trace->span(name, begin, trace_recorder::clock::now());
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
    report.server_stats = servers_.stats();
    for (const auto& w : workers_)
      if (w) report.skipped_batches += w->divergence.skipped();
    if (workers_[0]) {
      const auto& w0 = *workers_[0];
      report.train_loss = w0.metrics.mean_loss();
      report.train_auc = w0.metrics.auc().value_or(0.0);
      for (std::size_t p = 0; p < phase_count; ++p)
        report.phase_seconds[p] = w0.timer.seconds(p);
      report.dense_checksum = detail::values_checksum(dense_parameters());
    }
    return report;
  }

  struct worker_state {
    worker_state(const trainer& owner, int w)
        : model(owner.model_config_),
          dense(owner.make_dense_path()),
          sparse(owner.make_sparse_path()),
          divergence(owner.options_.on_divergence, owner.options_.blowup_warn_factor, w),
          index(w) {}
    Model model;
    dense_path_type dense;    ///< its optimizer state and compressor residual
    sparse_path_type sparse;  ///< the table replica, or the PS client and its push residuals
    phase_timer<phase_count> timer;
    training_metrics metrics;  ///< this segment's loss, logits and labels
    divergence_response divergence;
    int index = 0;  ///< the worker's index
  };

  [[nodiscard]] dense_path_type make_dense_path() const {
    if constexpr (traits::dense_on_ps)
      return servers_dense(dense_layout_, tables_.size());
    else
      return dense_path_type(dense_layout_, dense_optimizer_, options_.deterministic,
                             traits::dense_allreduce(communicator_));
  }
  [[nodiscard]] sparse_path_type make_sparse_path() const {
    if constexpr (on_ps)
      return server_rows<storage_type, error_feedback>();
    else
      return replicated_rows<Storage>(tables_, optimizer_, init());
  }

  /// Embedding initialisation: ±embedding_init_scale when set, else DLRM's per-table
  /// ±sqrt(1/rows); tables the model starts at zero (`zero_initialised(t)`) are zero.
  [[nodiscard]] embedding::uniform_init init() const {
    std::vector<std::uint64_t> rows;
    for (const auto& spec : tables_)
      rows.push_back(spec.rows);
    return embedding::uniform_init::for_training(options_.seed, options_.embedding_init_scale, rows,
                                                 zero_tables_);
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
  /// Worker w runs on rank w under every strategy (ps::layout puts dedicated servers after the
  /// workers, co-located ones on the same ranks).
  [[nodiscard]] bool is_worker(int rank) const noexcept {
    return rank >= 0 && rank < options_.workers;
  }
  [[nodiscard]] std::vector<int> worker_ranks() const {
    std::vector<int> ranks(static_cast<std::size_t>(options_.workers));
    std::iota(ranks.begin(), ranks.end(), 0);
    return ranks;
  }

  // ---- one segment on one rank ------------------------------------------------------------

  void rank_body(transport_type& t, const data::example_source& train_set, std::size_t first,
                 std::size_t end, const data::example_source* eval_set, bool evaluate,
                 std::optional<eval_point>& evaluated) {
    // A server rank serves (beside its worker when co-located); a worker rank trains.
    servers_.run(t, [&] { worker_body(t, train_set, first, end, eval_set, evaluate, evaluated); });
  }

  void worker_body(transport_type& t, const data::example_source& train_set, std::size_t first,
                   std::size_t end, const data::example_source* eval_set, bool evaluate,
                   std::optional<eval_point>& evaluated) {
    const int w = t.rank();
    auto& me = *workers_[static_cast<std::size_t>(w)];
    comm::group<transport_type> peers(t, worker_ranks());
    if constexpr (on_ps) {
      ps::client_options co;
      co.fp16_pulls = options_.fp16_pulls;
      // In-process pulls when nothing is rehearsed on the messages: no emulated link, no
      // straggler, no injected fault (they act on sends).
      if (options_.in_process_pulls && local_rank_ < 0 && !options_.link.emulated() &&
          options_.send_delay_seconds.empty() && options_.fail_rank < 0 && options_.faults.empty())
        co.in_process_servers = servers_.readers(options_.timeout_seconds);
      me.sparse.open(t, *map_, co);
    }

    const std::size_t global = options_.batch * static_cast<std::size_t>(options_.workers);
    const auto loader = train_set.loader(loader_config(static_cast<std::size_t>(w)));
    const auto load = [&](std::size_t s, step_buffers& b) { loader->load(s, b.batch); };
    // PS strategies pull split-phase into two alternating step buffers: the pull of step s + 1
    // leaves before step s computes (ps::async: its rows may miss this worker's push of step s)
    // or right after step s pushes (sync, bounded: the rows are exactly a blocking pull's, and
    // the dense allreduce of step s runs while the servers answer); its rows land at the start
    // of step s + 1. Without PS one buffer serves.
    step_buffers buffers(*this);
    std::optional<step_buffers> ahead;
    step_buffers* now = &buffers;
    step_buffers* next = nullptr;
    const auto begin_next = [&](std::size_t s) {
      if constexpr (on_ps) {
        if (s + 1 >= end) return;
        load(s + 1, *next);
        prepare_pulls(me, *next);
        me.timer.mark(data_phase);
        me.sparse.begin_fetch(next->pulls);
        me.timer.mark(pull_phase);
      }
    };
    if constexpr (on_ps) {
      next = &ahead.emplace(*this);
      me.timer.skip();
      load(first, *now);
      prepare_pulls(me, *now);
      me.sparse.begin_fetch(now->pulls);
      me.timer.mark(data_phase);
    }
    for (std::size_t s = first; s < end; ++s) {
      me.timer.skip();
      if constexpr (on_ps) {
        me.sparse.finish_fetch(now->pulls);
        after_fetch(me);
        me.timer.mark(pull_phase);
        if constexpr (prefetch) {
          begin_next(s);
          train_step(me, peers, *now, global, s, true, [] {});
        } else {
          train_step(me, peers, *now, global, s, true, [&] { begin_next(s); });
        }
        std::swap(now, next);
      } else {
        load(s, *now);
        me.timer.mark(data_phase);
        train_step(me, peers, *now, global, s, false, [] {});
      }
      if (trace_recorder* trace = traces_[static_cast<std::size_t>(t.rank())].get())
        trace->count("MiB sent", static_cast<double>(comm::total_bytes_sent(t)) / (1 << 20));
      if (w == 0 && options_.progress) {
        progress_->update(s + 1, cat("loss ", me.metrics.mean_loss(), "  sent ",
                                     comm::total_bytes_sent(t) >> 20, " MiB"));
      }
    }
    if (evaluate && w == 0)
      traced(t.rank(), "eval", [&] {
        evaluated = run_eval(me, *now, *eval_set, end);
        evaluated->train_seconds = me.timer.total();
      });
    if constexpr (traits::dense_on_ps) {
      if (w == 0) {  // worker 0's replica mirrors the servers' dense parameters
        const ps::table_pull dense = me.dense.pull_request();
        me.sparse.fetch(std::span(&dense, 1));
        me.dense.take(me.model.parameters());
      }
    }
    if constexpr (on_ps) me.sparse.close();
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
    }
    data::ctr_batch batch;
    std::vector<std::vector<std::uint64_t>> keys;
    std::vector<matrix<float>> rows, row_grads;
    std::vector<matrix_view<const float>> inputs;
    std::vector<matrix_view<float>> grad_views;
    std::vector<float> logits, dlogits;
    std::vector<ps::table_pull> pulls;  ///< every table's rows of one step
    std::vector<ps::table_push> pushes;
  };

  /// The step's rows of every table from the sparse path (and, for parameter_server, the dense
  /// parameters in the same round trip).
  void fetch(worker_state& me, step_buffers& b) {
    prepare_pulls(me, b);
    me.sparse.fetch(b.pulls);
    after_fetch(me);
  }
  /// The step's pulls, one entry per table (and the dense rows under parameter_server).
  void prepare_pulls(worker_state& me, step_buffers& b) {
    const std::size_t n = b.batch.size();
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
      pulls.push_back({t, keys, b.rows[t].view()});
      b.inputs[t] = b.rows[t].view();
      b.grad_views[t] = b.row_grads[t].view();
    }
    if constexpr (traits::dense_on_ps) pulls.push_back(me.dense.pull_request());
  }
  /// After the rows landed: the servers' dense parameters into the replica (parameter_server).
  void after_fetch(worker_state& me) {
    if constexpr (traits::dense_on_ps) me.dense.take(me.model.parameters());
  }

  /// One step: rows → forward, loss, backward → pushes (the rows' gradients, and the dense
  /// ones under parameter_server) → `after_push` (the next step's pull under sync PS) → the
  /// dense sum and optimizer (allreduce, hybrid).
  template <class AfterPush>
  void train_step(worker_state& me, comm::group<transport_type>& peers, step_buffers& b,
                  std::size_t global, std::size_t step, bool fetched, AfterPush&& after_push) {
    const std::size_t n = b.batch.size();
    if (!fetched) {
      fetch(me, b);
      me.timer.mark(pull_phase);
    }

    const auto compute_start = std::chrono::steady_clock::now();
    b.logits.resize(n);
    b.dlogits.resize(n);
    const models::ctr_inputs inputs{b.batch.dense.view(), b.inputs};
    me.model.forward(inputs, b.logits);
    const double loss = nn::bce_with_logits(b.logits, b.batch.labels, b.dlogits,
                                            1.0f / static_cast<float>(global), nn::reduction::sum);
    me.model.backward(b.dlogits, b.grad_views);
    const bool dropped = options_.divergence_guard && guard_divergence(me, b, loss, n, step);
    if (!dropped) me.metrics.add(loss, b.logits, b.batch.labels);
    straggle(me, compute_start);
    me.timer.mark(compute_phase);

    const auto grads = me.model.gradients();
    if constexpr (traits::dense_on_ps) me.dense.push(me.sparse.storage(), grads);
    auto& pushes = b.pushes;
    pushes.clear();
    for (std::size_t t = 0; t < tables_.size(); ++t)
      pushes.push_back({t, b.keys[t], b.row_grads[t].view()});
    me.sparse.apply(peers, pushes);
    me.timer.mark(on_ps ? push_phase : allreduce_phase);
    after_push();

    if constexpr (!traits::dense_on_ps) {
      if constexpr (foreign_allreduce)
        me.dense.sum(*workers_endpoint_, grads);
      else
        me.dense.sum(peers, grads);
      me.timer.mark(allreduce_phase);
      me.dense.apply(me.model.parameters(), grads);
      me.timer.mark(compute_phase);
    }
  }

  /// A slower worker (trainer_options::compute_slowdown): waits (factor − 1) × the compute
  /// time since `start`, so its step's compute takes factor × as long; its results are unchanged.
  void straggle(const worker_state& me, std::chrono::steady_clock::time_point start) const {
    if (options_.compute_slowdown.empty()) return;
    const double factor = options_.compute_slowdown[static_cast<std::size_t>(me.index)];
    if (factor <= 1.0) return;
    const auto elapsed = std::chrono::steady_clock::now() - start;
    std::this_thread::sleep_for(std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::duration<double>(elapsed) * (factor - 1.0)));
  }

  /// The divergence guard, before anything of the step leaves the worker (trainer_options'
  /// divergence_guard, on_divergence): a non-finite loss, dense gradient or row gradient stops
  /// the run or drops the batch — its gradients zeroed, returns true (divergence_guard.hpp).
  bool guard_divergence(worker_state& me, step_buffers& b, double loss, std::size_t n,
                        std::size_t step) {
    const std::string what = divergence_guard::first_non_finite(loss, me.model.gradients(), tables_,
                                                                b.keys, b.row_grads);
    const double per_sample = loss / static_cast<double>(std::max<std::size_t>(n, 1));
    if (!me.divergence.drop(what, per_sample, step, [&] { return checkpoints_.last_good(); }))
      return false;
    std::ranges::fill(me.model.gradients(), 0.0f);
    for (auto& g : b.row_grads)
      std::fill_n(g.data(), g.rows() * g.cols(), 0.0f);
    return true;
  }

  eval_point run_eval(worker_state& me, step_buffers& b, const data::example_source& eval_set,
                      std::size_t at_step) {
    return evaluate(eval_set, options_.batch, options_.eval_max_samples, at_step, b.batch,
                    [&](const data::ctr_batch& rows, std::span<float> logits) {
                      fetch(me, b);
                      me.model.forward(models::ctr_inputs{rows.dense.view(), b.inputs}, logits);
                    });
  }

  // ---- checkpoints (run_checkpoints.hpp: the directory, the protocol, the checks) --------

  [[nodiscard]] std::size_t dense_state_floats() const {
    return dense_optimizer_type::state_floats(options_.dense_row);
  }
  /// The files of this run's checkpoints beside state.ckpt.
  [[nodiscard]] checkpoint_files files() const {
    return {.replica = !traits::dense_on_ps,
            .residuals = parts::worker_residuals,
            .workers = options_.workers,
            .servers = on_ps ? roles_->servers() : 0};
  }
  /// This run's identity, as checkpoints record it.
  [[nodiscard]] checkpoint_meta run_meta(std::size_t step) const {
    std::string tables;  // "name rows dim" lines
    for (const auto& table : tables_)
      tables += cat(table.name, " ", table.rows, " ", table.dim, "\n");
    return {.step = step,
            .dense_count = dense_layout_.count(),
            .dense_row = options_.dense_row,
            .seed = options_.seed,
            .workers = options_.workers,
            .optimizer = optimizer_type::name,
            .dense_optimizer = dense_optimizer_type::name,
            .strategy = strategy_name,
            .tables = std::move(tables),
            .files = files().names(),
            .seals = {},
            .run_id = 0};
  }

  /// What each rank holds, into the checkpoint of `step`: worker 0 its replicas (dense rows,
  /// and the tables under ring_allreduce), each worker its residuals, each server its stripe
  /// of rows; rank 0 then seals them with the run's identity (run_checkpoints::write).
  template <comm::transport T>
  void write_checkpoint(T& t, std::size_t step) const {
    checkpoints_.write(t, step, run_meta(step), [&](const std::filesystem::path& staged) {
      if (t.rank() == 0) {
        if constexpr (!traits::dense_on_ps) {
          const auto& me = *workers_[0];
          row_records replica(tables_.size() + 1);
          if constexpr (!on_ps) me.sparse.save_rows(tables_.size(), replica.adder());
          me.dense.save_rows(me.model.parameters(), tables_.size(), replica.adder());
          replica.commit(staged / checkpoint_files::replica_file());
        }
      }
      if constexpr (parts::worker_residuals) {
        if (is_worker(t.rank())) {
          const int w = t.rank();
          const auto& me = *workers_[static_cast<std::size_t>(w)];
          checkpoint_writer residuals;
          me.dense.save_residual(residuals);
          me.sparse.save_residual(residuals);
          residuals.commit(staged / checkpoint_files::residual_file(w));
        }
      }
      if constexpr (on_ps) {
        if (roles_->is_server(t.rank())) {
          row_records stripe(tables_.size() + 1);
          servers_.at_rank(t.rank())->for_each_row(stripe.adder());
          stripe.commit(staged / checkpoint_files::stripe_file(roles_->server_index(t.rank())));
        }
      }
    });
  }

  /// Loads what `rank` holds from the checkpoint to resume from, written under any strategy and
  /// world size — its server's rows, its worker's replicas (the dense parameters under every
  /// strategy, the tables under ring_allreduce) and residuals — and returns its step.
  std::size_t load_checkpoint(int rank) {
    const auto dir = checkpoints_.latest();
    const auto saved = checkpoints_.open(dir, run_meta(0));
    worker_state* me = is_worker(rank) ? workers_[static_cast<std::size_t>(rank)].get() : nullptr;
    std::vector<row_shape> shapes;
    for (const auto& table : tables_)
      shapes.push_back({table.dim, optimizer_type::state_floats(table.dim)});
    shapes.push_back({options_.dense_row, dense_state_floats()});
    std::size_t dense_seen = 0;
    read_row_records(dir, shapes,
                     [&](std::size_t t, std::uint64_t key, std::span<const float> row,
                         std::span<const float> state, const std::filesystem::path& file) {
                       const bool dense = t == tables_.size();
                       // This rank's server takes the rows it owns (other ranks load theirs).
                       if (dense ? traits::dense_on_ps : on_ps)
                         servers_.import_owned(rank, t, key, row, state);
                       if (me == nullptr) return;
                       if (dense) {  // every worker keeps a replica of the dense parameters
                         if (key >= dense_layout_.rows())
                           fail(errc::corrupt_data,
                                cat("checkpoint ", file.string(), ": dense row ", key,
                                    " outside the model's ", dense_layout_.rows(), " rows"));
                         me->dense.load_row(me->model.parameters(), key, row, state);
                         ++dense_seen;
                       } else if constexpr (!on_ps) {
                         me->sparse.load_row(t, key, row, state);
                       }
                     });
    if (me != nullptr && dense_seen != dense_layout_.rows())
      fail(errc::corrupt_data, cat("checkpoint ", dir.string(), " holds ", dense_seen, " of the ",
                                   dense_layout_.rows(), " dense parameter rows"));
    if constexpr (parts::worker_residuals) {
      if (me != nullptr) {
        const auto residuals = run_checkpoints::residuals(dir, saved, rank, options_.workers);
        const checkpoint_reader* from = residuals ? &*residuals : nullptr;
        me->dense.load_residual(from);
        me->sparse.load_residual(from, map_ ? &*map_ : nullptr);
      }
    }
    checkpoints_.resumed(rank, dir, saved);
    return static_cast<std::size_t>(saved.step);
  }

  typename Model::config model_config_;
  optimizer_type optimizer_;
  dense_optimizer_type dense_optimizer_;
  trainer_options options_;
  Communicator communicator_;  ///< its options (the dense path's allreduce)
  std::vector<embedding::table_spec> tables_;
  std::size_t sparse_columns_ = 0;        ///< the model's sparse_features()
  std::vector<std::size_t> key_columns_;  ///< key_columns_[t]: the model's input_column(t)
  std::vector<bool> zero_tables_;         ///< the model's zero_initialised(t), when it says
  dense_rows dense_layout_;               ///< the dense parameters as rows of options_.dense_row
  std::optional<ps::layout> roles_;
  std::optional<ps::shard_map> map_;
  std::vector<std::unique_ptr<worker_state>> workers_;
  std::vector<std::unique_ptr<trace_recorder>> traces_;  ///< per rank, when tracing
  hosted_servers<server_type> servers_;  ///< PS strategies: the server ranks of this process
  std::unique_ptr<progress> progress_;
  int local_rank_ = -1;
  run_checkpoints checkpoints_;               ///< this run's (ranks of one process share it)
  workers_endpoint_type workers_endpoint_{};  ///< foreign_allreduce: this worker's endpoint
};

}  // namespace strata::train

/// @file trainer_state.hpp
/// What a CTR training run holds in this process, and everything done with it outside the
/// step: `trainer_state<Model, Storage, Communicator, Compressor, Transport, DenseOptimizer>`
/// builds the model's shape (tables, the column each reads, the dense parameters as rows), the
/// ranks' roles, each local worker's state (model replica, dense path, sparse path, timer,
/// metrics, divergence response) and the servers this process hosts; it writes and loads the
/// run's checkpoints (placement-free: any strategy and world size loads them), makes the
/// report, and enumerates and checksums the trained rows. `trainer` (trainer.hpp) derives from
/// it and adds the step loop only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/comm/concepts.hpp"
#include "strata/core/error.hpp"
#include "strata/core/progress.hpp"
#include "strata/core/timer.hpp"
#include "strata/data/sampler.hpp"
#include "strata/data/source.hpp"
#include "strata/embedding/concepts.hpp"
#include "strata/embedding/init.hpp"
#include "strata/ps/layout.hpp"
#include "strata/ps/partition.hpp"
#include "strata/train/checkpoint_rows.hpp"
#include "strata/train/composition.hpp"
#include "strata/train/divergence_guard.hpp"
#include "strata/train/evaluation.hpp"
#include "strata/train/options.hpp"
#include "strata/train/run_checkpoints.hpp"
#include "strata/train/run_traces.hpp"
#include "strata/train/servers.hpp"

namespace strata::train {

/// A CTR run's state in this process (see the file comment); the parameters are trainer's.
/// The queries are public; the rest is for the trainer that derives from it.
template <class Model, class Storage, class Communicator, class Compressor, class Transport,
          class DenseOptimizer>
class trainer_state {
 protected:
  using parts =
      trainer_composition<Model, Storage, Communicator, Compressor, Transport, DenseOptimizer>;
  using traits = typename parts::traits;
  static constexpr bool on_ps = parts::on_ps;
  using optimizer_type = typename parts::optimizer_type;
  using dense_optimizer_type = DenseOptimizer;
  using storage_type = typename parts::storage_type;
  using dense_path_type = typename parts::dense_path_type;
  using sparse_path_type = typename parts::sparse_path_type;
  using server_type = typename parts::server_type;
  static constexpr comm::tag_t checksum_tag = comm::tags::report;

  /// One worker's persistent state (built only for the workers that run in this process).
  struct worker_state {
    worker_state(const trainer_state& owner, int w)
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

  /// What rank 0 learns during a run (filled on the thread/process that hosts worker 0).
  struct outcome {
    std::size_t first_step = 0, steps = 0;
    std::vector<eval_point> evals;
  };

  trainer_state(typename Model::config model_config, optimizer_type optimizer,
                dense_optimizer_type dense_optimizer, trainer_options options, int local_rank,
                Communicator communicator)
      : model_config_(std::move(model_config)),
        optimizer_(optimizer),
        dense_optimizer_(dense_optimizer),
        options_(std::move(options)),
        communicator_(communicator),
        local_rank_(local_rank),
        checkpoints_(options_),
        traces_(options_.trace_file, 0) {
    options_.check();
    if constexpr (on_ps) ps::check_rule(consistency(), "trainer");
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
    if constexpr (on_ps)
      roles_ = options_.servers == 0 ? ps::layout::colocated(options_.workers)
                                     : ps::layout::dedicated(options_.workers, options_.servers);
    traces_ = run_traces(options_.trace_file, ranks());
    STRATA_EXPECTS(local_rank_ < ranks(), "trainer: local rank ", local_rank_, " outside the ",
                   ranks(), " ranks of this configuration (", options_.workers, " workers",
                   on_ps ? cat(", ", options_.servers, " servers") : std::string(), ")");
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
          *map_, [&](int rank) { return is_local(rank); }, consistency(), optimizer_,
          dense_optimizer_, tables_.size(), so);
      if constexpr (traits::dense_on_ps)  // the dense parameters are the last table's rows
        servers_.import_dense(tables_.size(), dense_layout_, probe.parameters(),
                              dense_state_floats());
    }
  }

 public:
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
  /// The consistency the servers and workers run under: the Communicator's policy type's rule,
  /// or the rule it carries (`ps::run_time_rule`); `ps::sync` without a parameter server.
  [[nodiscard]] ps::consistency_rule consistency() const {
    return consistency_rule_of(communicator_);
  }
  /// Under every PS strategy the next step's pull is split-phase. Under ps::async (a rule that
  /// does not block pulls on the step) it leaves before this step computes (one step stale at
  /// most); under sync and bounded right after this step's push, and the dense allreduce runs
  /// while the servers answer. False without a parameter server.
  [[nodiscard]] bool prefetches() const { return on_ps && !consistency().blocks_on_step; }
  [[nodiscard]] int ranks() const noexcept { return on_ps ? roles_->ranks() : options_.workers; }

 protected:
  // ---- the world's shape -------------------------------------------------------------------

  [[nodiscard]] bool is_local(int rank) const noexcept {
    return local_rank_ < 0 || rank == local_rank_;
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
  /// Column of the batch's keys that feeds table t (the model's input_column).
  [[nodiscard]] std::size_t key_column(std::size_t t) const { return key_columns_[t]; }

  // ---- the data ------------------------------------------------------------------------------

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
  /// Refuses training data the model cannot read or too small for one step.
  void check_data(const data::example_source& train_set) const {
    const Model probe(model_config_);
    STRATA_EXPECTS(train_set.size() >= options_.batch * static_cast<std::size_t>(options_.workers),
                   "trainer: the training set has ", train_set.size(),
                   " samples, fewer than one global batch (", options_.batch, " x ",
                   options_.workers, " workers)");
    STRATA_EXPECTS(train_set.dense_cols() == probe.dense_features() &&
                       train_set.sparse_cols() == sparse_columns_,
                   "trainer: the data has ", train_set.dense_cols(), " dense and ",
                   train_set.sparse_cols(), " sparse columns but the model reads ",
                   probe.dense_features(), " and ", sparse_columns_);
    // A sharded source refuses a layout it cannot deal (more shards than chunks, a batch that
    // is not a multiple of the shards) here, before any rank starts.
    STRATA_EXPECTS(train_set.steps_per_epoch(loader_config(0)) > 0,
                   "trainer: the training set has no whole step of ", options_.batch, " x ",
                   options_.workers, " workers");
  }

  // ---- the parts of a worker -----------------------------------------------------------------

  [[nodiscard]] dense_path_type make_dense_path() const {
    if constexpr (traits::dense_on_ps)
      return servers_dense(dense_layout_, tables_.size());
    else
      return dense_path_type(dense_layout_, dense_optimizer_, options_.deterministic,
                             traits::dense_allreduce(communicator_));
  }
  [[nodiscard]] sparse_path_type make_sparse_path() const {
    if constexpr (on_ps)
      return server_rows<storage_type, parts::error_feedback>();
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

  // ---- tracing and the report ----------------------------------------------------------------

  /// Starts rank `rank`'s timeline track when tracing; its worker's phase timer records into it.
  void start_trace(int rank) {
    if (!traces_.on()) return;
    const bool serves = on_ps && roles_->is_server(rank);
    std::string label = is_worker(rank) ? cat("worker ", rank) : std::string();
    if (serves)
      label += cat(label.empty() ? "" : " + ", "server ", roles_->server_index(rank), "/",
                   roles_->servers());
    trace_recorder* track = traces_.start(rank, std::move(label));
    if (is_worker(rank))
      workers_[static_cast<std::size_t>(rank)]->timer.trace_into(track, phase_names);
  }

  [[nodiscard]] train_report make_report(const outcome& result, double seconds) const {
    train_report report;
    report.strategy = parts::strategy_name;
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
  /// Every rank's embedding checksum summed on rank 0 of a multi-process world (a wrapping
  /// sum, order-free); the other ranks return their own share.
  template <comm::transport T>
  [[nodiscard]] std::uint64_t gathered_embedding_checksum(T& t) const {
    std::uint64_t sum = embedding_checksum();
    if (t.rank() != 0) {
      t.send(0, checksum_tag, std::as_bytes(std::span(&sum, 1)));
      return sum;
    }
    for (int peer = 1; peer < t.size(); ++peer) {
      std::uint64_t theirs = 0;
      t.recv(peer, checksum_tag, std::as_writable_bytes(std::span(&theirs, 1)));
      sum += theirs;
    }
    return sum;
  }

  // ---- checkpoints (run_checkpoints.hpp: the directory, the protocol, the checks) ----------

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
            .strategy = parts::strategy_name,
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
  hosted_servers<server_type> servers_;  ///< PS strategies: the server ranks of this process
  std::unique_ptr<progress> progress_;
  int local_rank_ = -1;
  run_checkpoints checkpoints_;  ///< this run's (ranks of one process share it)
  run_traces traces_;            ///< per rank, when tracing
  typename parts::workers_endpoint_type workers_endpoint_{};  ///< foreign_allreduce only
};

}  // namespace strata::train

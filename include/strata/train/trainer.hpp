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
/// storage, codecs, the compile-time checks); what the run holds in this process — the
/// workers' state, the hosted servers, checkpoint writing and loading, the report — is
/// `trainer_state` (trainer_state.hpp), which the trainer derives from. This file is the run
/// as calls: `fit` launches the ranks (threads of one process, or this process's rank of an MPI
/// world), `run_rank` trains in segments between evaluations (evaluation.hpp) and checkpoints
/// (run_checkpoints.hpp; at a segment boundary every rank is idle, so a checkpoint captures one
/// consistent state), `worker_body` runs a segment's steps, `train_step` one step. The servers
/// and their threads live in servers.hpp, the world's launch options in launch.hpp, the
/// timeline traces in run_traces.hpp.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <span>
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
#include "strata/core/timer.hpp"
#include "strata/data/batch.hpp"
#include "strata/data/source.hpp"
#include "strata/models/concepts.hpp"
#include "strata/nn/loss.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/train/divergence_guard.hpp"
#include "strata/train/evaluation.hpp"
#include "strata/train/launch.hpp"
#include "strata/train/options.hpp"
#include "strata/train/servers.hpp"
#include "strata/train/strategy.hpp"
#include "strata/train/trainer_state.hpp"

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
class trainer
    : public trainer_state<Model, Storage, Communicator, Compressor, Transport, DenseOptimizer> {
  using state = trainer_state<Model, Storage, Communicator, Compressor, Transport, DenseOptimizer>;
  using typename state::parts;
  using typename state::traits;
  static constexpr bool on_ps = parts::on_ps;
  static constexpr bool foreign_allreduce = parts::foreign_allreduce;

 public:
  using model_type = Model;
  using optimizer_type = typename parts::optimizer_type;  ///< the embedding tables'
  using dense_optimizer_type = DenseOptimizer;            ///< the dense parameters'
  using consistency_type = typename parts::consistency_type;
  using communicator_type = Communicator;
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
      : state(std::move(model_config), optimizer, optimizer, std::move(options), local_rank,
              communicator) {}

  /// As above, with `dense_optimizer` for the dense parameters (the MLPs).
  trainer(typename Model::config model_config, optimizer_type optimizer,
          dense_optimizer_type dense_optimizer, trainer_options options, int local_rank = -1,
          Communicator communicator = {})
      : state(std::move(model_config), optimizer, dense_optimizer, std::move(options), local_rank,
              communicator) {}

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
    this->check_data(train_set);
    traces_.check_writable(-1);
    const auto lock = checkpoints_.claim();
    comm::thread_world world(this->ranks(), world_options_for(options_, this->ranks()));
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
    train_report report = this->make_report(result, clock.seconds());
    report.faults_fired = world.faults_fired();
    split_traffic(world, servers_.stats(), report);
    traces_.write_all();
    report.embedding_checksum = this->embedding_checksum();
    return report;
  }

  /// Trains this process's rank of a multi-process world (every process calls it with its own
  /// endpoint; the trainer must have been built with `local_rank = t.rank()`). Rank 0's report
  /// holds the evaluations and checksums; byte counts are this rank's own.
  train_report fit(Transport& t, const data::example_source& train_set,
                   const data::example_source* eval_set = nullptr) {
    STRATA_EXPECTS(local_rank_ == t.rank(), "trainer: built for local rank ", local_rank_,
                   " but fit() runs on rank ", t.rank());
    STRATA_EXPECTS(t.size() == this->ranks(), "trainer: the world has ", t.size(),
                   " ranks but this configuration needs ", this->ranks(), " (", options_.workers,
                   " workers",
                   on_ps ? cat(" + ", this->roles_->servers(), " servers") : std::string(), ")");
    STRATA_EXPECTS(options_.faults.empty(),
                   "trainer: a fault plan (trainer_options::faults) is carried out by the "
                   "in-process world of fit(train, eval); a multi-process run rehearses a dead "
                   "rank with comm::crash_after (ctr_train --crash-rank/--crash-after-sends/"
                   "--crash-phase)");
    this->check_data(train_set);
    traces_.check_writable(t.rank());
    // The process of rank 0 (which publishes checkpoints) holds the directory's lock.
    const auto lock = t.rank() == 0 ? checkpoints_.claim() : std::nullopt;
    // Every rank (servers too) joins the split that gives the workers their own endpoint.
    if constexpr (foreign_allreduce)
      if (!workers_endpoint_) workers_endpoint_ = traits::allreduce::subset(t, is_worker(t.rank()));
    stopwatch clock;
    outcome result;
    run_rank(t, train_set, eval_set, result);
    train_report report = this->make_report(result, clock.seconds());
    for (int peer = 0; peer < t.size(); ++peer) {
      report.bytes_worker_to_worker += t.bytes_sent_to(peer);
    }
    report.embedding_checksum = this->gathered_embedding_checksum(t);
    traces_.write_rank(t.rank());
    return report;
  }

 private:
  using state::checkpoints_;
  using state::is_worker;
  using state::key_column;
  using state::local_rank_;
  using state::map_;
  using state::options_;
  using state::progress_;
  using state::servers_;
  using state::tables_;
  using state::traces_;
  using state::workers_;
  using state::workers_endpoint_;
  using typename state::outcome;
  using typename state::worker_state;

  /// Every rank's whole run: resume, then segments (train → servers restart their clocks →
  /// checkpoint) until the last step.
  template <comm::transport T>
  void run_rank(T& t, const data::example_source& train_set, const data::example_source* eval_set,
                outcome& result) {
    const std::size_t total = this->total_steps(train_set);
    this->start_trace(t.rank());
    std::size_t step = checkpoints_.resuming() ? this->load_checkpoint(t.rank()) : 0;
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
        traces_.span(t.rank(), "checkpoint", [&] { this->write_checkpoint(t, step); });
    }
    if (hosts_worker0) {
      result.steps = step;
      if (options_.progress && progress_)
        progress_->finish(cat("loss ", workers_[0]->metrics.mean_loss()));
    }
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
    comm::group<transport_type> peers(t, this->worker_ranks());
    if constexpr (on_ps) {
      ps::client_options co;
      co.fp16_pulls = options_.fp16_pulls;
      // In-process pulls when nothing is rehearsed on the messages: no emulated link, no
      // straggler, no injected fault (they act on sends).
      if (options_.in_process_pulls && local_rank_ < 0 && !options_.link.emulated() &&
          options_.send_delay_seconds.empty() && options_.fail_rank < 0 && options_.faults.empty())
        co.in_process_servers = servers_.readers(options_.timeout_seconds);
      me.sparse.open(t, *map_, this->consistency(), co);
    }

    const std::size_t global = options_.batch * static_cast<std::size_t>(options_.workers);
    const auto loader = train_set.loader(this->loader_config(static_cast<std::size_t>(w)));
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
    const bool prefetch = this->prefetches();
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
        // One step function for every rule: the next pull leaves here (prefetch) or once this
        // step has pushed.
        if (prefetch) begin_next(s);
        train_step(me, peers, *now, global, s, true, [&] {
          if (!prefetch) begin_next(s);
        });
        std::swap(now, next);
      } else {
        load(s, *now);
        me.timer.mark(data_phase);
        train_step(me, peers, *now, global, s, false, [] {});
      }
      if (trace_recorder* trace = traces_.at(t.rank()))
        trace->count("MiB sent", static_cast<double>(comm::total_bytes_sent(t)) / (1 << 20));
      if (w == 0 && options_.progress) {
        progress_->update(s + 1, cat("loss ", me.metrics.mean_loss(), "  sent ",
                                     comm::total_bytes_sent(t) >> 20, " MiB"));
      }
    }
    if (evaluate && w == 0)
      traces_.span(t.rank(), "eval", [&] {
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
};

}  // namespace strata::train

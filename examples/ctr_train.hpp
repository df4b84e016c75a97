// ctr_train's shared part: the parsed flags, the loaded data, and the trainer compositions the
// flags dispatch to. Every model's compositions (11 each: allreduce, ps and hybrid x compressor;
// the PS consistency is a run-time rule, ps::run_time_rule) are instantiated in its own translation
// unit — ctr_train_dlrm.cpp, ctr_train_wide_deep.cpp, ctr_train_gpu.cpp (CUDA builds) — so they
// compile in parallel; ctr_train.cpp parses the flags, loads the data, runs the advisor and calls
// train_dlrm / train_wide_deep / train_gpu_dlrm.
#pragma once

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>

#include "strata/comm/any_transport.hpp"
#include "strata/comm/fault.hpp"
#include "strata/compress/error_feedback.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/identity.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/compress/per_path.hpp"
#include "strata/compress/topk.hpp"
#include "strata/core/cli.hpp"
#include "strata/core/memory.hpp"
#include "strata/data/criteo.hpp"
#include "strata/data/ctr_binary.hpp"
#include "strata/data/synthetic.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
#include "strata/optim/adagrad.hpp"
#include "strata/optim/adam.hpp"
#include "strata/plan/advisor.hpp"
#include "strata/serve/bundle.hpp"
#include "strata/train/trainer.hpp"
#if defined(STRATA_WITH_CUDA)  // built with strata::cuda: --gpu trains DLRM with cuda::dlrm
#include "strata/cuda/dlrm.hpp"
#endif
#if defined(STRATA_WITH_MPI)  // built with the strata::mpi target: runs under mpirun too
#include "strata/mpi/environment.hpp"
#include "strata/mpi/transport.hpp"
#endif

namespace ctr_train_example {

using namespace strata;

struct flags {
  std::string model = "dlrm";
  std::string strategy = "hybrid";
  std::string consistency = "sync";
  std::uint64_t staleness = 2;  ///< --consistency bounded's S (--staleness)
  bool staleness_given = false;
  std::string compressor = "int8";
  std::string data, eval_data;
  std::size_t synthetic = 200'000;
  bool synthetic_given = false;
  std::size_t eval_samples = 20'000;
  std::uint64_t table_rows = 100'000;
  bool table_rows_given = false;
  /// Converted data whose tables differ in rows (read through a frequency-threshold
  /// vocabulary): each sparse feature's rows; empty: every table has table_rows.
  std::vector<std::uint64_t> feature_rows;
  /// The vocabulary converted --data is read through (empty: none).
  std::filesystem::path vocabulary;
  /// Rows of the tables of sparse feature c.
  [[nodiscard]] std::uint64_t rows_of(std::size_t c) const {
    return feature_rows.empty() ? table_rows : feature_rows[c];
  }
  /// The models' config.table_rows.
  [[nodiscard]] std::vector<std::uint64_t> model_table_rows() const {
    return feature_rows.empty() ? std::vector<std::uint64_t>{table_rows} : feature_rows;
  }
  /// The hashing of converted data (--data DIR of .ctrb files): its seed, which also hashes
  /// --eval-data TSV and goes into an exported bundle (unset: --seed, as TSV is read).
  std::optional<std::uint64_t> hash_seed;
  std::uint64_t distinct_ids = 200;
  std::size_t dim = 16;
  nn::gemm_engine gemm = nn::default_gemm_engine();  ///< --gemm: the MLPs' matrix library
  bool gemm_given = false;                           ///< --gemm was passed
  /// --lr; 0 = the model's default: DLRM Adagrad 0.02 (larger rates, e.g. 0.05, throw the
  /// loss up in the first steps while Adagrad's accumulators are empty), Wide & Deep FTRL 0.05.
  float lr = 0.0f;  ///< the tables' learning rate (0 = the model's default)
  /// the dense parameters' (MLPs') learning rate (0 = the model's: DLRM Adagrad 0.01 — 0.02 on
  /// the MLPs cost 0.017 AUC on Census Adult, see docs/ctr.md — Wide & Deep Adam 0.001)
  float dense_lr = 0.0f;
  std::size_t global_batch = 256;  ///< --batch: samples per step over all workers
  bool skip_bad_lines = false;
  bool stream = false;  ///< --stream: TSV --data / --eval-data streamed, never loaded whole
  bool tiny = false;
  /// --bottom-mlp / --top-mlp: hidden widths of the MLPs (empty = the model's default); the
  /// last layers (DLRM's bottom: --dim, top and Wide & Deep's deep MLP: 1) are added.
  std::vector<std::size_t> bottom_mlp, top_mlp;
  std::vector<std::pair<int, double>> stragglers;  ///< --straggler W:F
  int gpu = -1;             ///< CUDA device of every worker's DLRM (-1: the CPU model)
  std::string report_json;  ///< --report-json PATH: the final table as JSON (for bench_ctr)
  std::filesystem::path export_dir;  ///< --export DIR: an inference bundle of the final model
  std::string export_precision;      ///< --export-precision fp32|fp16|int8 (default fp32)
  int crash_rank = -1;               ///< fault rehearsal: this rank ...
  std::uint64_t crash_after = 0;     ///< ... fails on its n-th send
  comm::phase crash_phase = comm::phase::any;  ///< ... of this phase (--crash-phase)
  train::trainer_options options;
  bool advise = false;      ///< --advise: probe each strategy x compressor, predict, train nothing
  bool link_given = false;  ///< --link-gbps given: a cluster description for --strategy auto
  bool strategy_given = false;    ///< --strategy allreduce|ps|hybrid: --advise compares only it
  bool compressor_given = false;  ///< --compressor: --advise compares only it
  /// Set by the advisor's probes: run() stores its report here instead of printing it.
  struct probe_result* probe_out = nullptr;
  /// Under mpirun: this process's endpoint (one rank per process); null = ranks as threads.
  comm::any_transport* process = nullptr;
  [[nodiscard]] bool leader() const { return process == nullptr || process->rank() == 0; }
};

/// What one probe run of the advisor returns.
struct probe_result {
  train::train_report report;
  std::uint64_t dense_floats = 0;
};

/// The data (train, eval: in memory, or converted files mapped), and the teacher AUC or -1.
struct datasets {
  std::unique_ptr<const data::example_source> train, eval;
  double teacher_auc = -1;
};
/// The final table of a run (leader), and the JSON report when --report-json asks
/// (ctr_train.cpp).
void print_report(const flags& f, const train::train_report& r, const datasets& d,
                  std::uint64_t embedding_floats, std::size_t dense_floats);

/// --export: the trainer's final state as an inference bundle (serve/bundle.hpp).
template <class Trainer>
void export_bundle(const flags& f, const Trainer& trainer,
                   const typename Trainer::model_type::config& model_config, std::size_t steps) {
  if constexpr (serve::bundle_model<typename Trainer::model_type>) {
    serve::export_options o;
    o.rows = serve::parse_precision(f.export_precision).value_or(serve::precision::fp32);
    o.hash_seed = f.hash_seed;  // converted data: the files' hashing (else the run's seed)
    if (!f.vocabulary.empty()) o.vocabulary = f.vocabulary;  // raw lines map as training's
    const auto e = serve::export_trainer(trainer, model_config, f.export_dir, o, steps);
    log_line(cat("exported ", serve::to_string(o.rows), " bundle ", e.dir.string(), " (", e.bytes,
                 " bytes, fingerprint ", serve::bundle_manifest::hex(e.fingerprint), ")"));
  } else {
    fail(errc::unsupported,
         "--export: this model has no bundle format (drop --gpu: the bundle "
         "of a GPU-trained DLRM is written from its checkpoint with "
         "strata_export)");
  }
}

template <class Trainer, class Communicator>
void run(const flags& f, const typename Trainer::model_type::config& model_config,
         typename Trainer::optimizer_type optimizer,
         typename Trainer::dense_optimizer_type dense_optimizer, const datasets& d,
         const Communicator& communicator) {
  const data::example_source* eval =
      d.eval && d.eval->size() > 0 && f.probe_out == nullptr ? d.eval.get() : nullptr;
  train::train_report r;
  if (f.probe_out != nullptr) {  // an advisor's probe: threads, no link, nothing printed
    Trainer trainer(model_config, optimizer, dense_optimizer, f.options, -1, communicator);
    f.probe_out->report = trainer.fit(*d.train, nullptr);
    f.probe_out->dense_floats = typename Trainer::model_type(model_config).parameters().size();
    return;
  }
  if (f.process != nullptr) {
    Trainer trainer(model_config, optimizer, dense_optimizer, f.options, f.process->rank(),
                    communicator);
    r = trainer.fit(*f.process, *d.train, eval);
    if (!f.leader()) return;  // rank 0 prints the table
  } else {
    Trainer trainer(model_config, optimizer, dense_optimizer, f.options, -1, communicator);
    r = trainer.fit(*d.train, eval);
    if (!f.export_dir.empty()) export_bundle(f, trainer, model_config, r.steps);
  }
  std::uint64_t embedding_floats = 0;
  std::size_t dense_floats = 0;
  if (!f.report_json.empty()) {
    const typename Trainer::model_type probe(model_config);
    for (const auto& t : probe.tables())
      embedding_floats += t.rows * t.dim;
    dense_floats = probe.parameters().size();
  }
  print_report(f, r, d, embedding_floats, dense_floats);
}

template <class>
inline constexpr bool is_parameter_server = false;
template <class C>
inline constexpr bool is_parameter_server<train::parameter_server<C>> = true;
template <class>
inline constexpr bool is_hybrid = false;
template <class C, class A>
inline constexpr bool is_hybrid<train::hybrid<C, A>> = true;

template <class Model, class Storage, class Communicator, class DenseOptimizer>
void with_compressor(const flags& f, const typename Model::config& config,
                     typename Storage::optimizer_type optimizer, DenseOptimizer dense_optimizer,
                     const datasets& d, const Communicator& communicator = {}) {
  const auto run_with = [&]<class Compressor>(std::type_identity<Compressor>) {
    run<train::trainer<Model, Storage, Communicator, Compressor, comm::any_transport,
                       DenseOptimizer>>(f, config, optimizer, dense_optimizer, d, communicator);
  };
  using int8 = compress::error_feedback<compress::int8_block<256>>;
  if (f.compressor == "none") return run_with(std::type_identity<compress::identity>{});
  if (f.compressor == "fp16") return run_with(std::type_identity<compress::fp16>{});
  if (f.compressor == "int8") return run_with(std::type_identity<int8>{});
  if (f.compressor == "topk") {
    // Top-k sparsifies the dense gradients' allreduce; hybrid's row pushes (sparse already)
    // travel int8 with error feedback; the parameter-server strategy has no allreduce.
    using topk = compress::error_feedback<compress::topk>;
    if constexpr (is_parameter_server<Communicator>)
      fail(errc::invalid_argument,
           "--compressor topk sparsifies the dense allreduce, which --strategy ps does not run "
           "(its dense gradients are pushes); use allreduce or hybrid, or int8 / fp16 with ps");
    else if constexpr (is_hybrid<Communicator>)
      return run_with(std::type_identity<compress::per_path<topk, int8>>{});
    else
      return run_with(std::type_identity<topk>{});
  }
  fail(errc::invalid_argument,
       cat("--compressor must be none, fp16, int8 or topk, got '", f.compressor, "'"));
}

/// The flags' consistency as a run-time rule (bounded: --staleness S, default 2).
inline ps::consistency_rule consistency_rule(const flags& f) {
  if (f.consistency == "sync") return ps::rule_of<ps::sync>;
  if (f.consistency == "async") return ps::rule_of<ps::async>;
  if (f.consistency == "bounded") {
    return ps::bounded_rule(f.staleness);
  }
  fail(errc::invalid_argument,
       cat("--consistency must be sync, async or bounded, got '", f.consistency, "'"));
}

/// The PS strategies with the consistency chosen at run time: one composition per strategy
/// and compressor serves sync, async and every bounded<S>.
template <class Model, class Optimizer, class DenseOptimizer, class Strategy>
void with_consistency(const flags& f, const typename Model::config& config, Optimizer optimizer,
                      DenseOptimizer dense_optimizer, const datasets& d) {
  using tables = embedding::sharded<Optimizer, ps::run_time_rule, comm::any_transport>;
  Strategy strategy;
  strategy.rule = consistency_rule(f);
  with_compressor<Model, tables>(f, config, optimizer, dense_optimizer, d, strategy);
}

/// Dispatches the flags to one compile-time composition of the trainer: `optimizer` for the
/// embedding tables, `dense_optimizer` for the dense parameters.
template <class Model, class Optimizer, class DenseOptimizer>
void dispatch(const flags& f, const typename Model::config& config, Optimizer optimizer,
              DenseOptimizer dense_optimizer, const datasets& d) {
  std::string strategy = f.strategy;
  if (strategy == "auto") {
    Model probe(config);
    std::uint64_t embedding_bytes = 0;
    for (const auto& t : probe.tables())
      embedding_bytes += t.rows * t.dim * sizeof(float);
    const std::uint64_t dense_bytes = probe.parameters().size() * sizeof(float);
    // One worker in one process has nobody to share parameters with: every table stays local
    // (allreduce over one rank moves nothing). Otherwise the size rule decides.
    const bool alone = f.options.workers == 1 && f.process == nullptr && f.consistency == "sync";
    strategy = alone ? "allreduce" : train::choose_strategy(embedding_bytes, dense_bytes);
    if (f.leader())
      log_line(cat("--strategy auto: embeddings ", embedding_bytes >> 20, " MiB, dense ",
                   dense_bytes >> 10, " KiB, ", f.options.workers, " worker",
                   f.options.workers == 1 ? "" : "s", " -> ", strategy));
  }
  if (strategy == "allreduce") {
    if (f.consistency != "sync")
      fail(errc::invalid_argument,
           "--strategy allreduce is always synchronous; use --consistency sync");
    return with_compressor<Model, embedding::local<Optimizer>, comm::ring_allreduce>(
        f, config, optimizer, dense_optimizer, d);
  }
  if (strategy == "ps")
    return with_consistency<Model, Optimizer, DenseOptimizer,
                            train::parameter_server<ps::run_time_rule>>(f, config, optimizer,
                                                                        dense_optimizer, d);
  if (strategy == "hybrid")
    return with_consistency<Model, Optimizer, DenseOptimizer, train::hybrid<ps::run_time_rule>>(
        f, config, optimizer, dense_optimizer, d);
  fail(errc::invalid_argument,
       cat("--strategy must be auto, allreduce, ps or hybrid, got '", strategy, "'"));
}

// One function per model, each defined in its own file (the compositions of that model).
void train_dlrm(const flags& f, const models::dlrm::config& config, optim::adagrad optimizer,
                optim::adagrad dense_optimizer, const datasets& d);
void train_wide_deep(const flags& f, const models::wide_deep::config& config,
                     optim::adagrad optimizer, optim::adam dense_optimizer, const datasets& d);
#if defined(STRATA_WITH_CUDA)
void train_gpu_dlrm(const flags& f, const cuda::dlrm::config& config, optim::adagrad optimizer,
                    optim::adagrad dense_optimizer, const datasets& d);
#endif

}  // namespace ctr_train_example

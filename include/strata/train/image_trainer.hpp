/// @file image_trainer.hpp
/// `image_trainer<Model, Compressor, Optimizer, Transport, Allreduce>`: data-parallel training
/// of an image classifier (models::resnet) through the same dense path as the CTR trainer —
/// no tables; every worker holds a replica, its shard of each global batch, and one
/// `allreduce_dense` that sums the gradients (strata's ring, rank-ordered when deterministic,
/// through `Compressor` when lossy, or another Allreduce such as `mpi::native_allreduce`) and
/// applies `Optimizer` row by row. Synchronised batch norm is a dense-path collective
/// (`allreduce_dense::sum_statistics`): N workers normalise as one worker on the global batch.
///
/// ```cpp
/// strata::train::image_trainer<strata::models::resnet> trainer(
///     {.blocks_per_stage = 3}, strata::optim::momentum{.lr = 0.1f}, {.workers = 2, .batch = 128});
/// auto report = trainer.fit(train, &test);                 // ranks as threads
/// // one MPI process per rank: image_trainer<resnet, identity, momentum, mpi::transport>
/// // built with local_rank = t.rank(), then trainer.fit(t, train, &test) on every process.
/// ```
///
/// One step on worker w (global step s): its slice of global batch s (augmented when asked) →
/// forward (batch norm sums its statistics over the workers) → softmax cross-entropy scaled by
/// 1/global batch → backward → `dense.sum` → the learning rate of step s → `dense.apply`.
/// The threaded run and the MPI run execute this very code over their transports, so they
/// give bitwise the same parameters.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <numbers>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/compress/concepts.hpp"
#include "strata/compress/identity.hpp"
#include "strata/core/error.hpp"
#include "strata/core/progress.hpp"
#include "strata/core/timer.hpp"
#include "strata/data/augment.hpp"
#include "strata/data/idx.hpp"
#include "strata/data/metrics.hpp"
#include "strata/data/sampler.hpp"
#include "strata/models/image_concepts.hpp"
#include "strata/nn/softmax_cross_entropy.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/optim/momentum.hpp"
#include "strata/train/checkpoint_rows.hpp"
#include "strata/train/dense_path.hpp"
#include "strata/train/evaluation.hpp"
#include "strata/train/run_checkpoints.hpp"

namespace strata::train {

/// How an image_trainer runs.
struct image_trainer_options {
  int workers = 2;          ///< data-parallel workers (threads, or MPI processes)
  std::size_t batch = 128;  ///< the global batch, split evenly over the workers
  std::size_t epochs = 1;
  std::uint64_t seed = 1;  ///< the model's initialisation, the data order, the augmentation
  /// Sums in rank order: a run is bitwise reproducible and its gradient sums do not depend on
  /// the ring's layout (slower: every rank sends its whole share to each owner).
  bool deterministic = false;
  bool sync_batch_norm = true;  ///< batch norm over the global batch (false: per worker)
  /// Cosine decay of the optimizer's learning rate from its value to 0 over the run
  /// (lr_s = lr · ½(1 + cos(π s / steps))); false: constant.
  bool cosine_lr = true;
  std::optional<data::augment_options> augment{};  ///< random crop + flip of training images
  std::size_t dense_row = 256;   ///< rows of the optimizer's update (allreduce_dense)
  std::size_t eval_batch = 256;  ///< test images per forward
  double timeout_seconds = 600;  ///< a rank waiting longer than this for a peer fails
  bool progress = false;         ///< a progress line on worker 0's terminal
  /// Checkpoints at epoch ends into this directory (empty: none): the parameters with the
  /// optimizer state, each worker's batch-norm running statistics and compressor residual.
  std::filesystem::path checkpoint_dir{};
  std::size_t checkpoint_every = 1;     ///< epochs between checkpoints (the last one always)
  bool resume = false;                  ///< continue from checkpoint_dir's latest checkpoint
  std::filesystem::path resume_from{};  ///< continue from this checkpoint (step-N folder)

  void check() const {
    STRATA_EXPECTS(workers >= 1, "image_trainer: workers must be ≥ 1, got ", workers);
    STRATA_EXPECTS(batch >= 1 && batch % static_cast<std::size_t>(workers) == 0,
                   "image_trainer: the global batch ", batch, " must split evenly over ", workers,
                   " workers; pass a multiple of ", workers);
    STRATA_EXPECTS(epochs >= 1, "image_trainer: epochs must be ≥ 1");
    STRATA_EXPECTS(dense_row >= 1, "image_trainer: dense_row must be ≥ 1");
    STRATA_EXPECTS(eval_batch >= 1, "image_trainer: eval_batch must be ≥ 1");
    STRATA_EXPECTS(timeout_seconds > 0, "image_trainer: timeout_seconds must be positive");
    STRATA_EXPECTS(checkpoint_every >= 1, "image_trainer: checkpoint_every must be >= 1 epoch");
    STRATA_EXPECTS(!resume || resume_from.empty(),
                   "image_trainer: resume and resume_from both set; resume_from names the "
                   "checkpoint, drop resume");
    STRATA_EXPECTS(!resume || !checkpoint_dir.empty(),
                   "image_trainer: resume needs a checkpoint directory (--checkpoint-dir)");
  }
};

/// One epoch's results, as every rank agrees on them.
struct image_epoch {
  std::size_t epoch = 0;         ///< 1-based
  double train_loss = 0;         ///< mean over the epoch's steps of the global batch's mean loss
  double test_accuracy = 0;      ///< on the test set (0 without one)
  double images_per_second = 0;  ///< training images of every worker per second
};

/// What `fit` returns.
struct image_report {
  std::vector<image_epoch> epochs;  ///< the epochs this run trained (after the resumed ones)
  std::size_t first_step = 0;       ///< > 0 when resumed
  std::size_t steps = 0;
  double seconds = 0;
  /// Checksum of the final parameters' bits (every replica's is the same).
  std::uint64_t parameter_checksum = 0;
};

/// The image trainer (see the file's comment). `Optimizer` is a row-wise
/// `optim::sparse_optimizer` with a learning rate `lr` (momentum SGD by default; optim::adam
/// works too). Not thread-safe; `fit` runs the whole world on threads.
template <models::image_model Model, compress::compressor Compressor = compress::identity,
          optim::sparse_optimizer Optimizer = optim::momentum,
          comm::transport Transport = comm::thread_transport,
          class Allreduce = comm::ring_allreduce>
class image_trainer {
  static_assert(
      requires(Optimizer o) { o.lr = 0.1f; },
      "image_trainer: the Optimizer needs a learning rate member `lr` (the schedule "
      "sets it every step)");

 public:
  using model_type = Model;
  using dense_path_type = allreduce_dense<Compressor, Optimizer, Allreduce>;

  /// A trainer for every worker of a thread_world (`local_rank` < 0: `fit(train, test)`), or
  /// for one process of a multi-process world (`local_rank` = its rank: `fit(t, train, test)`
  /// on every process, each with the whole data set; rank r trains on shard r).
  image_trainer(typename Model::config config, Optimizer optimizer, image_trainer_options options,
                int local_rank = -1, Allreduce allreduce = {})
      : config_(std::move(config)),
        optimizer_(optimizer),
        options_(std::move(options)),
        local_rank_(local_rank),
        allreduce_(allreduce) {
    options_.check();
    if constexpr (requires { config_.seed; }) config_.seed = options_.seed;
    STRATA_EXPECTS(local_rank_ < options_.workers, "image_trainer: local rank ", local_rank_,
                   " outside the ", options_.workers, " workers");
    STRATA_EXPECTS(std::isfinite(optimizer_.lr) && optimizer_.lr > 0,
                   "image_trainer: the learning rate must be positive and finite, got ",
                   optimizer_.lr);
  }

  /// Trains with every worker as a thread of this process.
  image_report fit(const data::image_dataset& train, const data::image_dataset* test = nullptr) {
    static_assert(std::is_same_v<Transport, comm::thread_transport>,
                  "image_trainer::fit(train, test) runs the workers as threads: use "
                  "comm::thread_transport, or call fit(transport, train, test) on every process");
    STRATA_EXPECTS(local_rank_ < 0, "image_trainer: built for rank ", local_rank_,
                   " of a multi-process world; call fit(transport, train, test) on every process");
    check_data(train, test);
    const run_checkpoints checkpoints = checkpoints_for(train);
    const auto lock = checkpoints.claim();
    comm::thread_world world(options_.workers, {.timeout_seconds = options_.timeout_seconds});
    std::vector<image_report> reports(static_cast<std::size_t>(options_.workers));
    stopwatch clock;
    world.run([&](comm::thread_transport& t) {
      reports[static_cast<std::size_t>(t.rank())] = run_rank(t, train, test, checkpoints);
    });
    reports[0].seconds = clock.seconds();
    return reports[0];
  }

  /// Trains this process's worker of a multi-process world (the trainer was built with
  /// `local_rank = t.rank()`); every process returns the same report.
  image_report fit(Transport& t, const data::image_dataset& train,
                   const data::image_dataset* test = nullptr) {
    STRATA_EXPECTS(local_rank_ == t.rank(), "image_trainer: built for local rank ", local_rank_,
                   " but fit() runs on rank ", t.rank());
    STRATA_EXPECTS(t.size() == options_.workers, "image_trainer: the world has ", t.size(),
                   " ranks but the options name ", options_.workers, " workers");
    check_data(train, test);
    const run_checkpoints checkpoints = checkpoints_for(train);
    const auto lock = t.rank() == 0 ? checkpoints.claim() : std::nullopt;
    stopwatch clock;
    image_report report = run_rank(t, train, test, checkpoints);
    report.seconds = clock.seconds();
    return report;
  }

  /// The final parameters (worker 0's replica, or this process's worker's).
  [[nodiscard]] const std::vector<float>& parameters() const noexcept { return parameters_; }
  [[nodiscard]] const image_trainer_options& options() const noexcept { return options_; }

 private:
  void check_data(const data::image_dataset& train, const data::image_dataset* test) const {
    const Model probe(config_);
    const auto check = [&](const data::image_dataset& set, const char* which) {
      STRATA_EXPECTS(set.images.rows() == set.labels.size(), "image_trainer: the ", which,
                     " set has ", set.images.rows(), " images but ", set.labels.size(), " labels");
      STRATA_EXPECTS(set.images.cols() == probe.input_size(), "image_trainer: the ", which,
                     " images have ", set.images.cols(), " values each but the model reads ",
                     probe.input_size(), " (height x width x channels)");
      for (std::size_t i = 0; i < set.labels.size(); ++i)
        STRATA_EXPECTS(set.labels[i] < probe.classes(), "image_trainer: ", which, " label ", i,
                       " is ", int{set.labels[i]}, " but the model has ", probe.classes(),
                       " classes");
    };
    check(train, "training");
    if (test != nullptr) check(*test, "test");
    STRATA_EXPECTS(train.size() >= options_.batch, "image_trainer: ", train.size(),
                   " training images, fewer than one global batch of ", options_.batch);
    if (options_.augment)
      STRATA_EXPECTS(train.height * train.width * channels(train) == probe.input_size(),
                     "image_trainer: augmentation needs the images' shape; the training set says ",
                     train.height, " x ", train.width, " for ", probe.input_size(),
                     " values per image");
  }
  [[nodiscard]] static std::size_t channels(const data::image_dataset& set) {
    const std::size_t pixels = set.height * set.width;
    return pixels == 0 ? 0 : set.images.cols() / pixels;
  }

  [[nodiscard]] std::size_t steps_per_epoch(const data::image_dataset& train) const {
    return data::sharded_sampler(train.size(), static_cast<std::size_t>(options_.workers), 0,
                                 options_.batch, options_.seed)
        .steps_per_epoch();
  }
  [[nodiscard]] run_checkpoints checkpoints_for(const data::image_dataset& train) const {
    return run_checkpoints(options_.checkpoint_dir,
                           options_.checkpoint_every * steps_per_epoch(train), options_.resume,
                           options_.resume_from);
  }

  /// One worker's whole run.
  template <comm::transport T>
  image_report run_rank(T& t, const data::image_dataset& train, const data::image_dataset* test,
                        const run_checkpoints& checkpoints) {
    const auto rank = static_cast<std::size_t>(t.rank());
    const auto workers = static_cast<std::size_t>(options_.workers);
    Model net(config_);
    dense_path_type dense(dense_rows(net.parameters().size(), options_.dense_row), optimizer_,
                          options_.deterministic, allreduce_);
    if (options_.sync_batch_norm && workers > 1)
      net.set_bn_sync([&](std::span<double> sums) { dense.sum_statistics(t, sums); });
    data::sharded_sampler sampler(train.size(), workers, rank, options_.batch, options_.seed);
    const std::size_t local = sampler.local_batch(), steps = sampler.steps_per_epoch();
    const std::size_t pixels = net.input_size(), classes = net.classes();
    const std::size_t total = steps * options_.epochs;
    std::optional<data::augmenter> augment;
    if (options_.augment) {
      data::augment_options a = *options_.augment;
      a.seed = options_.seed;
      augment.emplace(data::image_shape{train.height, train.width, channels(train)}, a);
    }
    std::vector<float> images(local * pixels), logits(local * classes), dlogits(local * classes);
    std::vector<std::uint8_t> labels(local);
    std::optional<progress> bar;
    if (rank == 0 && options_.progress) bar.emplace("train", total, "steps");
    const float base_lr = optimizer_.lr;
    const float scale = 1.0f / static_cast<float>(options_.batch);
    image_report report;
    std::size_t first_epoch = 0;
    if (checkpoints.resuming()) {
      report.first_step = load_checkpoint(checkpoints, t.rank(), net, dense, steps);
      first_epoch = report.first_step / steps;
    }
    for (std::size_t e = first_epoch; e < options_.epochs; ++e) {
      sampler.set_epoch(e);
      net.set_mode(nn::mode::train);
      stopwatch epoch_clock;
      double loss_sum = 0;  // this worker's share of the global batches' mean losses
      for (std::size_t s = 0; s < steps; ++s) {
        const std::size_t step = e * steps + s;
        const auto indices = sampler.batch(s);
        for (std::size_t i = 0; i < local; ++i) {
          const std::span<float> out(images.data() + i * pixels, pixels);
          if (augment)
            augment->apply(train.images.row(indices[i]), out, e, indices[i]);
          else
            std::ranges::copy(train.images.row(indices[i]), out.begin());
          labels[i] = train.labels[indices[i]];
        }
        net.forward({images.data(), local, pixels}, {logits.data(), local, classes});
        loss_sum += nn::softmax_cross_entropy<std::uint8_t>({logits.data(), local, classes}, labels,
                                                            {dlogits.data(), local, classes}, scale,
                                                            nn::reduction::sum) /
                    static_cast<double>(options_.batch);
        net.backward({dlogits.data(), local, classes});
        const auto grads = net.gradients();
        dense.sum(t, grads);
        dense.optimizer().lr = learning_rate(base_lr, step, total);
        dense.apply(net.parameters(), grads);
        if (bar) bar->update(step + 1, cat("epoch ", e + 1, " loss ", loss_sum / double(s + 1)));
      }
      image_epoch epoch{.epoch = e + 1};
      // The epoch's loss and the test accuracy, summed over the workers (lossless, float64).
      double sums[2] = {loss_sum, test != nullptr ? correct_on_slice(net, *test, rank) : 0.0};
      dense.sum_statistics(t, std::span<double>(sums));
      epoch.train_loss = sums[0] / static_cast<double>(steps);
      if (test != nullptr && test->size() > 0)
        epoch.test_accuracy = sums[1] / static_cast<double>(test->size());
      epoch.images_per_second =
          static_cast<double>(steps * options_.batch) / std::max(epoch_clock.seconds(), 1e-9);
      if (rank == 0)
        log_line(cat("epoch ", e + 1, "/", options_.epochs, ": train loss ", epoch.train_loss,
                     test != nullptr ? cat(", test accuracy ", epoch.test_accuracy) : std::string(),
                     ", ", static_cast<long>(epoch.images_per_second), " images/s"));
      report.epochs.push_back(epoch);
      if (checkpoints.due((e + 1) * steps, total))
        write_checkpoint(checkpoints, t, (e + 1) * steps, net, dense);
    }
    if (bar) bar->finish();
    report.steps = total;
    const auto params = net.parameters();
    report.parameter_checksum = detail::values_checksum(params);
    if (rank == 0 || local_rank_ >= 0) parameters_.assign(params.begin(), params.end());
    return report;
  }

  // ---- checkpoints (run_checkpoints.hpp: the directory, the protocol, the checks) ---------

  /// This run's identity, as checkpoints record it (no tables).
  [[nodiscard]] checkpoint_meta run_meta(std::size_t step, std::size_t parameters) const {
    return {
        .step = step,
        .dense_count = parameters,
        .dense_row = options_.dense_row,
        .seed = options_.seed,
        .workers = options_.workers,
        .optimizer = Optimizer::name,
        .dense_optimizer = Optimizer::name,
        .strategy = "image_trainer",
        .tables = {},
        .files = checkpoint_files{.replica = true, .residuals = true, .workers = options_.workers}
                     .names(),
        .seals = {},
        .run_id = 0};
  }
  /// Worker 0 writes its replica (parameters with optimizer state, as rows of dense_row), every
  /// worker its running statistics and compressor residual; rank 0 seals them with the run's
  /// identity (run_checkpoints::write).
  template <comm::transport T>
  void write_checkpoint(const run_checkpoints& checkpoints, T& t, std::size_t step, Model& net,
                        const dense_path_type& dense) const {
    checkpoints.write(t, step, run_meta(step, net.parameters().size()),
                      [&](const std::filesystem::path& staged) {
                        if (t.rank() == 0) {
                          row_records replica(1);
                          dense.save_rows(net.parameters(), 0, replica.adder());
                          replica.commit(staged / checkpoint_files::replica_file());
                        }
                        checkpoint_writer own;
                        own.add_values<float>("running_statistics", net.running_statistics());
                        dense.save_residual(own);
                        own.commit(staged / checkpoint_files::residual_file(t.rank()));
                      });
  }
  /// Loads the checkpoint to resume from into this worker (written by any worker count: the
  /// running statistics then come from worker 0's file and the compressor residual starts at
  /// zero) and returns its step, an epoch boundary of this run.
  std::size_t load_checkpoint(const run_checkpoints& checkpoints, int rank, Model& net,
                              dense_path_type& dense, std::size_t steps) const {
    const auto dir = checkpoints.latest();
    const auto saved = checkpoints.open(dir, run_meta(0, net.parameters().size()));
    STRATA_EXPECTS(saved.step % steps == 0, "image_trainer: checkpoint ", dir.string(),
                   " is at step ", saved.step, ", not at an epoch end of this run (", steps,
                   " steps per epoch with a global batch of ", options_.batch,
                   "): resume with the batch size it was written with");
    const dense_rows rows(net.parameters().size(), options_.dense_row);
    std::size_t seen = 0;
    const row_shape shape{options_.dense_row, Optimizer::state_floats(options_.dense_row)};
    read_row_records(dir, std::span(&shape, 1),
                     [&](std::size_t, std::uint64_t key, std::span<const float> row,
                         std::span<const float> state, const std::filesystem::path& file) {
                       if (key >= rows.rows())
                         fail(errc::corrupt_data,
                              cat("checkpoint ", file.string(), ": parameter row ", key,
                                  " outside the model's ", rows.rows(), " rows"));
                       dense.load_row(net.parameters(), key, row, state);
                       ++seen;
                     });
    if (seen != rows.rows())
      fail(errc::corrupt_data, cat("checkpoint ", dir.string(), " holds ", seen, " of the ",
                                   rows.rows(), " parameter rows"));
    const bool same_workers = saved.workers == options_.workers;
    const checkpoint_reader own(dir / checkpoint_files::residual_file(same_workers ? rank : 0));
    net.set_running_statistics(own.values<float>("running_statistics"));
    dense.load_residual(same_workers ? &own : nullptr);
    checkpoints.resumed(rank, dir, saved);
    return static_cast<std::size_t>(saved.step);
  }

  /// The learning rate of `step` of `total`.
  [[nodiscard]] float learning_rate(float base, std::size_t step, std::size_t total) const {
    if (!options_.cosine_lr) return base;
    const double progress = static_cast<double>(step) / static_cast<double>(total);
    return base * 0.5f * (1.0f + static_cast<float>(std::cos(std::numbers::pi * progress)));
  }

  /// Correct predictions on this worker's contiguous slice of the test set (running statistics).
  double correct_on_slice(Model& net, const data::image_dataset& test, std::size_t rank) const {
    net.set_mode(nn::mode::eval);
    const auto workers = static_cast<std::size_t>(options_.workers);
    const std::size_t per = (test.size() + workers - 1) / workers;
    const std::size_t first = std::min(test.size(), rank * per);
    const std::size_t last = std::min(test.size(), first + per);
    const std::size_t pixels = net.input_size(), classes = net.classes();
    std::vector<float> out(options_.eval_batch * classes);
    double correct = 0;
    for (std::size_t b = first; b < last; b += options_.eval_batch) {
      const std::size_t m = std::min(options_.eval_batch, last - b);
      net.forward({test.images.data() + b * pixels, m, pixels}, {out.data(), m, classes});
      correct += static_cast<double>(m) *
                 data::argmax_accuracy({out.data(), m, classes},
                                       std::span<const std::uint8_t>(test.labels).subspan(b, m));
    }
    net.set_mode(nn::mode::train);
    return correct;
  }

  typename Model::config config_;
  Optimizer optimizer_;
  image_trainer_options options_;
  int local_rank_ = -1;
  Allreduce allreduce_;
  std::vector<float> parameters_;
};

}  // namespace strata::train

/// @file resnet_train.cpp
/// Data-parallel training of a CIFAR-style ResNet on Fashion-MNIST through
/// strata::train::image_trainer: N workers, each with a model replica and its shard of every
/// global batch; gradients summed by ring allreduce (optionally compressed; int8 with error
/// feedback), BN statistics synchronised (N workers = one worker on the global batch), then the
/// same optimizer step on every replica (momentum SGD with weight decay, or Adam; cosine
/// learning-rate decay). Test accuracy after every epoch.
///
/// The workers run as threads of this process, or — started by mpirun/mpiexec — one per MPI
/// process (`mpiexec -n 2 resnet_train …` gives bitwise the parameters of `--workers 2`).
///
///   resnet_train [--workers 2] [--batch 128] [--epochs 1] [--lr 0.1] [--depth-n 3]
///                [--train-limit N] [--test-limit N] [--data-dir DIR] [--seed 1]
///                [--compress none|fp16|int8] [--optimizer momentum|adam]
///                [--local-bn] [--augment] [--deterministic] [--csv PATH]
///                [--conv winograd|onednn|im2col]
///                [--checkpoint-dir DIR] [--checkpoint-every E] [--resume | --resume-from DIR]
///
/// --augment: random crop (2 pixels of black padding) and left-right flip of every training
/// image, chosen by (seed, epoch, image index) — the same on any worker count.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 false positives in Eigen
#pragma GCC diagnostic ignored "-Wuninitialized"        // (its AVX-512 ptranspose)

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "strata/compress/error_feedback.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/identity.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/core/cli.hpp"
#include "strata/core/timer.hpp"
#include "strata/data/idx.hpp"
#include "strata/models/resnet.hpp"
#include "strata/optim/adam.hpp"
#include "strata/optim/momentum.hpp"
#include "strata/train/image_trainer.hpp"

#if defined(STRATA_WITH_MPI)  // built with the strata::mpi target: runs under mpirun too
#include "strata/mpi/environment.hpp"
#include "strata/mpi/transport.hpp"
#endif

namespace {

using namespace strata;

struct flags {
  int workers = 2;
  std::size_t batch = 128, epochs = 1, depth_n = 3, train_limit = 0, test_limit = 0;
  float lr = 0.1f;
  std::uint64_t seed = 1;
  std::string data_dir = data::fashion_mnist_dir.string(), compress = "none",
              optimizer = "momentum", conv = "winograd", csv, checkpoint_dir, resume_from;
  std::size_t checkpoint_every = 1;
  bool local_bn = false, augment = false, deterministic = false, resume = false;

  [[noreturn]] static void usage(int code) {
    std::printf(
        "usage: resnet_train [flags]\n"
        "  --workers N         data-parallel workers (threads), 1..256 (default 2; under\n"
        "                      mpirun: one per process, this flag is ignored)\n"
        "  --batch B           global batch, split over the workers (default 128)\n"
        "  --epochs E          (default 1)\n"
        "  --lr LR             learning rate, (0, 100] (default 0.1)\n"
        "  --depth-n N         ResNet-(6N+2) (default 3: ResNet-20)\n"
        "  --train-limit N --test-limit N   use the first N images only (0 = all)\n"
        "  --data-dir DIR      Fashion-MNIST IDX files (default %s)\n"
        "  --seed S\n"
        "  --compress none|fp16|int8        gradients on the wire (int8: error feedback)\n"
        "  --optimizer momentum|adam\n"
        "  --local-bn          batch-norm statistics per worker (default: synchronised)\n"
        "  --augment           random crop (2 px) and flip, keyed by (seed, epoch, image)\n"
        "  --deterministic     gradient sums in rank order (reproducible across ring layouts)\n"
        "  --csv PATH          per-epoch results\n"
        "  --conv winograd|onednn|im2col    convolution engine (default winograd: 3x3\n"
        "                      stride-1 layers; the stride-2 ones on onednn when built)\n"
        "  --checkpoint-dir DIR       checkpoints at epoch ends (the two newest kept)\n"
        "  --checkpoint-every E       epochs between checkpoints (default 1)\n"
        "  --resume            continue from --checkpoint-dir's latest checkpoint\n"
        "  --resume-from DIR   continue from this checkpoint (a step-N folder)\n",
        data::fashion_mnist_dir.string().c_str());
    std::exit(code);
  }

  static flags parse(int argc, char** argv) {
    flags f;
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      const auto value = [&] { return cli::flag_value(argc, argv, i, "resnet_train: "); };
      // Strict values (strata::cli): whole numbers in range, finite reals, known names.
      const auto count = [&](std::size_t lo, std::size_t hi) {
        return cli::parse_integer<std::size_t>(a, value(), lo, hi);
      };
      if (a == "--help" || a == "-h")
        usage(0);
      else if (a == "--local-bn")
        f.local_bn = true;
      else if (a == "--augment")
        f.augment = true;
      else if (a == "--deterministic")
        f.deterministic = true;
      else if (a == "--resume")
        f.resume = true;
      else if (a == "--resume-from")
        f.resume_from = value();
      else if (a == "--checkpoint-dir")
        f.checkpoint_dir = value();
      else if (a == "--checkpoint-every")
        f.checkpoint_every = count(1, 100'000);
      else if (a == "--workers")
        f.workers = cli::parse_integer<int>(a, value(), 1, 256);
      else if (a == "--batch")
        f.batch = count(1, std::size_t{1} << 20);
      else if (a == "--epochs")
        f.epochs = count(1, 100'000);
      else if (a == "--depth-n")
        f.depth_n = count(1, 200);
      else if (a == "--train-limit")
        f.train_limit = count(0, std::size_t{1} << 40);
      else if (a == "--test-limit")
        f.test_limit = count(0, std::size_t{1} << 40);
      else if (a == "--lr")
        f.lr = static_cast<float>(cli::parse_real(a, value(), {0.0, 100.0, true}));
      else if (a == "--seed")
        f.seed = cli::parse_integer<std::uint64_t>(a, value(), 0, ~std::uint64_t{0});
      else if (a == "--data-dir")
        f.data_dir = value();
      else if (a == "--compress")
        f.compress = cli::parse_name(a, value(), {"none", "fp16", "int8"});
      else if (a == "--optimizer")
        f.optimizer = cli::parse_name(a, value(), {"momentum", "adam"});
      else if (a == "--csv")
        f.csv = value();
      else if (a == "--conv")
        f.conv = cli::parse_name(a, value(), {"winograd", "onednn", "im2col"});
      else
        fail(errc::invalid_argument, cat("resnet_train: unknown flag '", a, "'; see --help"));
    }
    return f;
  }
};

/// Trains with one compile-time composition: `Compressor` on the wire, `Optimizer` on every
/// replica, `Transport` between the workers (threads, or this process's MPI endpoint).
template <class Compressor, class Optimizer, class Transport>
train::image_report train_with(const flags& f, Optimizer optimizer,
                               const train::image_trainer_options& options,
                               const data::image_dataset& train, const data::image_dataset& test,
                               Transport* process) {
  const models::resnet::config cfg{.blocks_per_stage = f.depth_n,
                                   .seed = f.seed,
                                   .conv = f.conv == "onednn"   ? nn::conv_engine::onednn
                                           : f.conv == "im2col" ? nn::conv_engine::im2col
                                                                : nn::conv_engine::winograd};
  if (process == nullptr) {
    train::image_trainer<models::resnet, Compressor, Optimizer> trainer(cfg, optimizer, options);
    return trainer.fit(train, &test);
  }
  train::image_trainer<models::resnet, Compressor, Optimizer, Transport> trainer(
      cfg, optimizer, options, process->rank());
  return trainer.fit(*process, train, &test);
}

template <class Optimizer, class Transport>
train::image_report train_compressed(const flags& f, Optimizer optimizer,
                                     const train::image_trainer_options& options,
                                     const data::image_dataset& train,
                                     const data::image_dataset& test, Transport* process) {
  if (f.compress == "fp16")
    return train_with<compress::fp16, Optimizer>(f, optimizer, options, train, test, process);
  if (f.compress == "int8")
    return train_with<compress::error_feedback<compress::int8_block<256>>, Optimizer>(
        f, optimizer, options, train, test, process);
  return train_with<compress::identity, Optimizer>(f, optimizer, options, train, test, process);
}

template <class Transport>
train::image_report train_resnet(const flags& f, const train::image_trainer_options& options,
                                 const data::image_dataset& train, const data::image_dataset& test,
                                 Transport* process) {
  if (f.optimizer == "adam")
    return train_compressed(f, optim::adam{.lr = f.lr}, options, train, test, process);
  return train_compressed(f, optim::momentum{.lr = f.lr}, options, train, test, process);
}

/// The first `n` images of `set`.
data::image_dataset first_images(const data::image_dataset& set, std::size_t n) {
  if (n == 0 || n >= set.size()) return set;
  data::image_dataset out = set;
  out.images = matrix<float>(n, set.images.cols());
  std::copy_n(set.images.data(), n * set.images.cols(), out.images.data());
  out.labels.resize(n);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    flags f = flags::parse(argc, argv);
#if defined(STRATA_WITH_MPI)
    std::optional<mpi::environment> mpi_env;
    std::optional<mpi::transport> process;
    if (cli::launched_by_mpi()) {  // one worker per process
      mpi_env.emplace(argc, argv);
      process.emplace(mpi::transport_options{.timeout_seconds = 600});
      f.workers = process->size();
    }
    mpi::transport* endpoint = process ? &*process : nullptr;
    const bool leader = endpoint == nullptr || endpoint->rank() == 0;
#else
    if (cli::launched_by_mpi())
      fail(errc::unsupported,
           "resnet_train was built without MPI (strata::mpi); install libopenmpi-dev and rebuild "
           "to run it under mpirun");
    comm::thread_transport* endpoint = nullptr;
    const bool leader = true;
#endif
    STRATA_EXPECTS(f.batch % static_cast<std::size_t>(f.workers) == 0, "resnet_train: --batch ",
                   f.batch, " is the global batch and must split evenly over ", f.workers,
                   " workers");
    if (leader) log_line(cat("resnet_train: loading Fashion-MNIST from ", f.data_dir));
    const auto train =
        first_images(data::load_fashion_mnist(f.data_dir, data::mnist_split::train), f.train_limit);
    const auto test =
        first_images(data::load_fashion_mnist(f.data_dir, data::mnist_split::test), f.test_limit);
    if (leader)
      log_line(cat("resnet_train: ResNet-", 6 * f.depth_n + 2, ", ", f.workers,
                   endpoint != nullptr ? " MPI processes" : " workers", ", global batch ", f.batch,
                   ", ", train.size(), " training / ", test.size(), " test images, lr ", f.lr, ", ",
                   f.optimizer, ", compression ", f.compress, ", convolutions ", f.conv,
                   f.local_bn ? ", per-worker BN" : ", synchronised BN",
                   f.augment ? ", crop+flip augmentation" : ""));
    train::image_trainer_options options;
    options.workers = f.workers;
    options.batch = f.batch;
    options.epochs = f.epochs;
    options.seed = f.seed;
    options.deterministic = f.deterministic;
    options.sync_batch_norm = !f.local_bn;
    options.progress = leader;
    options.checkpoint_dir = f.checkpoint_dir;
    options.checkpoint_every = f.checkpoint_every;
    options.resume = f.resume;
    options.resume_from = f.resume_from;
    options.check();  // before loading the data
    if (f.augment)
      options.augment =
          data::augment_options{.pad = 2, .flip = true, .fill = data::fashion_mnist_black};
    stopwatch total;
    const train::image_report report = train_resnet(f, options, train, test, endpoint);
    if (leader && report.epochs.empty()) {
      std::printf(
          "resnet_train: resumed at step %zu, the end of the %zu epochs asked: nothing to "
          "train; parameters %016llx\n",
          report.first_step, f.epochs, static_cast<unsigned long long>(report.parameter_checksum));
    } else if (leader) {
      std::printf(
          "resnet_train: ResNet-%zu, %d workers, %zu epochs, final test accuracy %.4f, "
          "parameters %016llx, %.1f s\n",
          6 * f.depth_n + 2, f.workers, f.epochs, report.epochs.back().test_accuracy,
          static_cast<unsigned long long>(report.parameter_checksum), total.seconds());
      if (!f.csv.empty()) {
        std::ofstream out(f.csv);
        if (!out) fail(errc::io_error, cat("resnet_train: cannot write ", f.csv));
        out << "epoch,train_loss,test_accuracy\n";
        for (const auto& e : report.epochs)
          out << e.epoch << "," << e.train_loss << "," << e.test_accuracy << "\n";
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_train: %s\n", e.what());
    return 1;
  }
}

/// @file resnet_train.cpp
/// Data-parallel training of a CIFAR-style ResNet on Fashion-MNIST: N workers as threads
/// (comm::thread_world), each with a model replica and its shard of every global batch
/// (data::sharded_sampler); gradients averaged by ring allreduce (optionally compressed),
/// BN statistics synchronised (N workers = one worker on the global batch), then the same
/// SGD-momentum step on every replica. Test accuracy after every epoch.
///
///   resnet_train [--workers 2] [--batch 128] [--epochs 1] [--lr 0.1] [--depth-n 3]
///                [--train-limit N] [--test-limit N] [--data-dir DIR] [--seed 1]
///                [--compress none|fp16|int8] [--optimizer momentum|adam]
///                [--local-bn] [--augment] [--csv PATH]
///
/// --augment: random crop (2 pixels of black padding) and left-right flip of every training
/// image, chosen by (seed, epoch, image index) — the same on any worker count.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 false positive in Eigen

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "strata/comm/collectives.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/compress/compressed_allreduce.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/core/cli.hpp"
#include "strata/core/progress.hpp"
#include "strata/core/timer.hpp"
#include "strata/data/augment.hpp"
#include "strata/data/idx.hpp"
#include "strata/data/metrics.hpp"
#include "strata/data/sampler.hpp"
#include "strata/models/resnet.hpp"
#include "strata/nn/optimizers.hpp"
#include "strata/nn/softmax_cross_entropy.hpp"

namespace {

using namespace strata;

struct flags {
  int workers = 2;
  std::size_t batch = 128, epochs = 1, depth_n = 3, train_limit = 0, test_limit = 0;
  float lr = 0.1f;
  std::uint64_t seed = 1;
  std::string data_dir = data::fashion_mnist_dir.string(), compress = "none",
              optimizer = "momentum", csv;
  bool local_bn = false, augment = false;

  [[noreturn]] static void usage(int code) {
    std::printf(
        "usage: resnet_train [flags]\n"
        "  --workers N         data-parallel workers (threads), 1..256 (default 2)\n"
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
        "  --csv PATH          per-epoch results\n",
        data::fashion_mnist_dir.string().c_str());
    std::exit(code);
  }

  static flags parse(int argc, char** argv) {
    flags f;
    for (int i = 1; i < argc; ++i) {
      const std::string_view a = argv[i];
      const auto value = [&]() -> std::string {
        if (i + 1 >= argc)
          fail(errc::invalid_argument, cat("resnet_train: flag ", a, " needs a value; see --help"));
        return argv[++i];
      };
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
      else
        fail(errc::invalid_argument, cat("resnet_train: unknown flag '", a, "'; see --help"));
    }
    STRATA_EXPECTS(f.batch % static_cast<std::size_t>(f.workers) == 0, "resnet_train: --batch ",
                   f.batch, " is the global batch and must split evenly over ", f.workers,
                   " workers");
    return f;
  }
};

/// SGD with momentum 0.9 and weight decay 5e-4 (He et al.'s CIFAR recipe):
/// v = μ·v + (g + λ·p);  p −= lr·v. One float of state per parameter; element-wise.
struct momentum_sgd {
  float lr = 0.1f, momentum = 0.9f, decay = 5e-4f;
  std::vector<float> velocity;
  void step(std::span<float> p, std::span<const float> g) {
    if (velocity.size() != p.size()) velocity.assign(p.size(), 0.0f);
    for (std::size_t i = 0; i < p.size(); ++i) {
      velocity[i] = momentum * velocity[i] + g[i] + decay * p[i];
      p[i] -= lr * velocity[i];
    }
  }
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const flags f = flags::parse(argc, argv);
    log_line(cat("resnet_train: loading Fashion-MNIST from ", f.data_dir));
    const auto train = data::load_fashion_mnist(f.data_dir, data::mnist_split::train);
    const auto test = data::load_fashion_mnist(f.data_dir, data::mnist_split::test);
    const std::size_t n_train =
        f.train_limit ? std::min(f.train_limit, train.size()) : train.size();
    const std::size_t n_test = f.test_limit ? std::min(f.test_limit, test.size()) : test.size();
    const models::resnet::config cfg{.blocks_per_stage = f.depth_n, .seed = f.seed};
    log_line(cat("resnet_train: ResNet-", 6 * f.depth_n + 2, ", ", f.workers,
                 " workers, global batch ", f.batch, ", ", n_train, " training / ", n_test,
                 " test images, lr ", f.lr, ", ", f.optimizer, ", compression ", f.compress,
                 f.local_bn ? ", per-worker BN" : ", synchronised BN",
                 f.augment ? ", crop+flip augmentation" : ""));

    std::vector<double> accuracy(f.epochs, 0.0);
    std::vector<double> epoch_loss(f.epochs, 0.0);
    stopwatch total;
    comm::thread_world world(f.workers, {.timeout_seconds = 600});
    world.run([&](comm::thread_transport& t) {
      const auto rank = static_cast<std::size_t>(t.rank());
      models::resnet net(cfg);  // same seed: identical replicas
      if (!f.local_bn) net.set_bn_sync([&t](std::span<double> s) { comm::allreduce(t, s); });
      data::sharded_sampler sampler(n_train, static_cast<std::size_t>(f.workers), rank, f.batch,
                                    f.seed);
      const std::size_t local = sampler.local_batch(), steps = sampler.steps_per_epoch();
      compress::fp16 fp16;
      compress::int8_block<256> int8;
      momentum_sgd sgd;
      sgd.lr = f.lr;
      nn::adam adam(f.lr);
      std::vector<float> images(local * 784), logits(local * 10), d(local * 10);
      std::vector<std::uint8_t> labels(local);
      const data::augmenter augment(
          {28, 28, 1}, {.pad = 2, .flip = true, .fill = data::fashion_mnist_black, .seed = f.seed});
      std::optional<progress> bar;
      if (rank == 0) bar.emplace("train", steps * f.epochs, "steps");
      for (std::size_t e = 0; e < f.epochs; ++e) {
        sampler.set_epoch(e);
        net.set_mode(nn::mode::train);
        stopwatch epoch_clock;
        double loss_sum = 0;
        for (std::size_t s = 0; s < steps; ++s) {
          // Cosine learning-rate decay over the whole run.
          const double progress_frac =
              static_cast<double>(e * steps + s) / static_cast<double>(f.epochs * steps);
          const float lr =
              f.lr * 0.5f * (1.0f + static_cast<float>(std::cos(M_PI * progress_frac)));
          const auto idx = sampler.batch(s);
          for (std::size_t i = 0; i < local; ++i) {
            if (f.augment)
              augment.apply(train.images.row(idx[i]), std::span(images).subspan(i * 784, 784), e,
                            idx[i]);
            else
              std::ranges::copy(train.images.row(idx[i]), images.begin() + long(i * 784));
            labels[i] = train.labels[idx[i]];
          }
          net.forward({images.data(), local, 784}, {logits.data(), local, 10});
          double loss = nn::softmax_cross_entropy<std::uint8_t>(
              {logits.data(), local, 10}, labels, {d.data(), local, 10}, 1.0f / float(local));
          net.backward({d.data(), local, 10});
          if (f.compress == "fp16")
            compress::compressed_allreduce(t, net.gradients(), fp16, comm::reduce_op::mean);
          else if (f.compress == "int8")
            compress::compressed_allreduce(t, net.gradients(), int8, comm::reduce_op::mean);
          else
            comm::allreduce(t, net.gradients(), comm::reduce_op::mean);
          comm::allreduce(t, std::span(&loss, 1), comm::reduce_op::mean);
          if (f.optimizer == "adam") {
            adam.lr = lr;
            adam.step(net.parameters(), net.gradients());
          } else {
            sgd.lr = lr;
            sgd.step(net.parameters(), net.gradients());
          }
          loss_sum += loss;
          if (bar) {
            const double ips = static_cast<double>((s + 1) * f.batch) / epoch_clock.seconds();
            bar->update(e * steps + s + 1,
                        cat("epoch ", e + 1, " loss ", loss, " images/s ", static_cast<long>(ips)));
          }
        }
        // Test accuracy: each rank scores its slice, correct counts summed.
        net.set_mode(nn::mode::eval);
        const std::size_t per = (n_test + static_cast<std::size_t>(f.workers) - 1) /
                                static_cast<std::size_t>(f.workers);
        const std::size_t first = std::min(n_test, rank * per),
                          last = std::min(n_test, first + per);
        double correct = 0;
        std::vector<float> out(256 * 10);
        for (std::size_t b = first; b < last; b += 256) {
          const std::size_t m = std::min<std::size_t>(256, last - b);
          net.forward({test.images.data() + b * 784, m, 784}, {out.data(), m, 10});
          correct +=
              m * data::argmax_accuracy({out.data(), m, 10}, std::span(test.labels).subspan(b, m));
        }
        comm::allreduce(t, std::span(&correct, 1));
        if (rank == 0) {
          accuracy[e] = correct / static_cast<double>(n_test);
          epoch_loss[e] = loss_sum / static_cast<double>(steps);
          log_line(
              cat("epoch ", e + 1, "/", f.epochs, ": train loss ", epoch_loss[e],
                  ", test accuracy ", accuracy[e], " (", n_test, " images), ",
                  static_cast<long>(static_cast<double>(steps * f.batch) / epoch_clock.seconds()),
                  " images/s"));
        }
      }
      if (bar) bar->finish();
    });
    std::printf(
        "resnet_train: ResNet-%zu, %d workers, %zu epochs, final test accuracy %.4f, "
        "%.1f s\n",
        6 * f.depth_n + 2, f.workers, f.epochs, accuracy.back(), total.seconds());
    if (!f.csv.empty()) {
      std::ofstream out(f.csv);
      if (!out) fail(errc::io_error, cat("resnet_train: cannot write ", f.csv));
      out << "epoch,train_loss,test_accuracy\n";
      for (std::size_t e = 0; e < f.epochs; ++e)
        out << e + 1 << "," << epoch_loss[e] << "," << accuracy[e] << "\n";
    }
    return 0;
  } catch (const strata::error& e) {
    std::fprintf(stderr, "resnet_train: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "resnet_train: %s\n", e.what());
    return 1;
  }
}

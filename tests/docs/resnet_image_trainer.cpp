// The image_trainer program of docs/resnet.md (CI compiles and runs it), on a small synthetic
// 28 × 28 data set in place of Fashion-MNIST: two workers as threads train ResNet-8 for two
// epochs; the report must hold both epochs, a lower loss in the second, and finite numbers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12 false positives in Eigen
#pragma GCC diagnostic ignored "-Wuninitialized"        // (its AVX-512 ptranspose)

#include <cmath>
#include <cstdio>

#include "strata/core/rng.hpp"
#include "strata/data/idx.hpp"
#include "strata/models/resnet.hpp"
#include "strata/optim/momentum.hpp"
#include "strata/train/image_trainer.hpp"

namespace {
/// Images whose class is the row band holding a bright stripe (10 bands of ~3 rows).
strata::data::image_dataset stripes(std::size_t count, std::uint64_t seed) {
  strata::data::image_dataset set;
  set.height = set.width = 28;
  set.classes = 10;
  set.images = strata::matrix<float>(count, 784);
  set.labels.resize(count);
  const strata::counter_rng rng{seed, 1};
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t label = rng.below(i, 10);
    set.labels[i] = static_cast<std::uint8_t>(label);
    for (std::size_t p = 0; p < 784; ++p)
      set.images(i, p) =
          (p / 28 / 3 == label ? 1.0f : 0.0f) + 0.3f * rng.normal(1000 + 784 * i + p);
  }
  return set;
}
}  // namespace

int main() {
  const auto train = stripes(512, 1);
  const auto test = stripes(128, 2);
  strata::train::image_trainer<strata::models::resnet> trainer(  // Compressor, Optimizer,
      {.blocks_per_stage = 1},                                   // Transport, Allreduce: defaults
      strata::optim::momentum{.lr = 0.1f},                       // SGD momentum 0.9, wd 5e-4
      {.workers = 2, .batch = 64, .epochs = 2});
  const auto report = trainer.fit(train, &test);  // report.epochs[e].test_accuracy, …
  const bool ok =
      report.epochs.size() == 2 && report.epochs[1].train_loss < report.epochs[0].train_loss &&
      std::isfinite(report.epochs[1].test_accuracy) && report.epochs[1].test_accuracy > 0.5;
  std::printf("image_trainer: loss %.4f -> %.4f, test accuracy %.3f: %s\n",
              report.epochs[0].train_loss, report.epochs[1].train_loss,
              report.epochs[1].test_accuracy, ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}

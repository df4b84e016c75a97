// train::image_trainer (ResNet through the dense path): one worker against a hand-written
// training loop (bitwise), N workers with synchronised batch norm against one worker on the
// global batch, compressed gradients, learning, and every bad input refused with a sentence.
#include <catch2/catch.hpp>

#include <cmath>
#include <numbers>
#include <vector>

#include "strata/compress/error_feedback.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/data/sampler.hpp"
#include "strata/models/resnet.hpp"
#include "strata/nn/softmax_cross_entropy.hpp"
#include "strata/optim/adam.hpp"
#include "strata/optim/momentum.hpp"
#include "strata/train/image_trainer.hpp"
#include "support/image_fixtures.hpp"

using namespace strata;
using strata_test::tiny_images;
using strata_test::tiny_resnet;

namespace {

train::image_trainer_options options_for(int workers) {
  train::image_trainer_options o;
  o.workers = workers;
  o.batch = 32;
  o.epochs = 2;
  o.seed = 5;
  return o;
}

/// The training loop written out by hand for one worker: the model, the sampler's batches,
/// softmax cross-entropy of the batch mean, momentum SGD over the flat parameters with the
/// cosine learning rate.
std::vector<float> reference_run(const data::image_dataset& train,
                                 const train::image_trainer_options& o, optim::momentum opt) {
  auto cfg = tiny_resnet();
  cfg.seed = o.seed;
  models::resnet net(cfg);
  data::sharded_sampler sampler(train.size(), 1, 0, o.batch, o.seed);
  const std::size_t steps = sampler.steps_per_epoch(), total = steps * o.epochs;
  std::vector<float> images(o.batch * 64), logits(o.batch * 3), dlogits(o.batch * 3);
  std::vector<std::uint8_t> labels(o.batch);
  std::vector<float> velocity(net.parameters().size(), 0.0f);
  const float base = opt.lr;
  for (std::size_t e = 0; e < o.epochs; ++e) {
    sampler.set_epoch(e);
    for (std::size_t s = 0; s < steps; ++s) {
      const auto idx = sampler.batch(s);
      for (std::size_t i = 0; i < o.batch; ++i) {
        std::ranges::copy(train.images.row(idx[i]), images.begin() + long(i * 64));
        labels[i] = train.labels[idx[i]];
      }
      net.forward({images.data(), o.batch, 64}, {logits.data(), o.batch, 3});
      (void)nn::softmax_cross_entropy<std::uint8_t>({logits.data(), o.batch, 3}, labels,
                                                    {dlogits.data(), o.batch, 3},
                                                    1.0f / static_cast<float>(o.batch));
      net.backward({dlogits.data(), o.batch, 3});
      const double progress = static_cast<double>(e * steps + s) / static_cast<double>(total);
      opt.lr = base * 0.5f * (1.0f + static_cast<float>(std::cos(std::numbers::pi * progress)));
      opt.apply(net.parameters(), velocity, net.gradients());
    }
  }
  const auto p = net.parameters();
  return {p.begin(), p.end()};
}

}  // namespace

TEST_CASE("image_trainer: one worker is the hand-written training loop, bitwise",
          "[train][image_trainer]") {
  const auto train_set = tiny_images(256, 1);
  const auto o = options_for(1);
  const optim::momentum opt{.lr = 0.05f};
  train::image_trainer<models::resnet> trainer(tiny_resnet(), opt, o);
  const auto report = trainer.fit(train_set);
  REQUIRE(report.steps == 2 * (256 / 32));
  REQUIRE(report.epochs.size() == 2);
  REQUIRE(trainer.parameters() == reference_run(train_set, o, opt));
  REQUIRE(report.parameter_checksum == train::detail::values_checksum(trainer.parameters()));
}

TEST_CASE(
    "image_trainer: workers with synchronised batch norm train as one worker on the global "
    "batch; per-worker batch norm does not",
    "[train][image_trainer]") {
  const auto train_set = tiny_images(256, 2);
  const optim::momentum opt{.lr = 0.05f};
  train::image_trainer<models::resnet> one(tiny_resnet(), opt, options_for(1));
  (void)one.fit(train_set);
  for (int workers : {2, 4}) {
    CAPTURE(workers);
    train::image_trainer<models::resnet> many(tiny_resnet(), opt, options_for(workers));
    (void)many.fit(train_set);
    // The same sums in another order: float rounding only.
    REQUIRE(one.parameters().size() == many.parameters().size());
    REQUIRE(strata_test::relative_distance(many.parameters(), one.parameters()) < 1e-4);

    auto local = options_for(workers);
    local.sync_batch_norm = false;
    train::image_trainer<models::resnet> unsynced(tiny_resnet(), opt, local);
    (void)unsynced.fit(train_set);
    REQUIRE(strata_test::relative_distance(unsynced.parameters(), one.parameters()) > 1e-3);
  }
}

TEST_CASE("image_trainer: runs are reproducible, rank-ordered sums included",
          "[train][image_trainer]") {
  const auto train_set = tiny_images(256, 3);
  for (bool deterministic : {false, true}) {
    auto o = options_for(3);
    o.batch = 30;
    o.deterministic = deterministic;
    o.augment = data::augment_options{.pad = 1, .flip = true, .fill = -0.5f};
    train::image_trainer<models::resnet> a(tiny_resnet(), optim::momentum{.lr = 0.05f}, o);
    train::image_trainer<models::resnet> b(tiny_resnet(), optim::momentum{.lr = 0.05f}, o);
    REQUIRE(a.fit(train_set).parameter_checksum == b.fit(train_set).parameter_checksum);
    REQUIRE(a.parameters() == b.parameters());
  }
}

TEST_CASE("image_trainer learns the tiny problem, with lossless and with int8 gradients",
          "[train][image_trainer]") {
  const auto train_set = tiny_images(960, 4);
  const auto test_set = tiny_images(300, 40);
  auto o = options_for(2);
  o.epochs = 4;
  train::image_trainer<models::resnet> lossless(tiny_resnet(), optim::momentum{.lr = 0.1f}, o);
  const auto plain = lossless.fit(train_set, &test_set);
  REQUIRE(plain.epochs.back().train_loss < plain.epochs.front().train_loss);
  REQUIRE(plain.epochs.back().test_accuracy >= 0.8);

  using int8_ef = compress::error_feedback<compress::int8_block<256>>;
  train::image_trainer<models::resnet, int8_ef> compressed(tiny_resnet(),
                                                           optim::momentum{.lr = 0.1f}, o);
  const auto quantised = compressed.fit(train_set, &test_set);
  REQUIRE(quantised.parameter_checksum != plain.parameter_checksum);  // it did compress
  REQUIRE(quantised.epochs.back().test_accuracy >= plain.epochs.back().test_accuracy - 0.05);

  train::image_trainer<models::resnet, compress::identity, optim::adam> adam(
      tiny_resnet(), optim::adam{.lr = 0.01f}, o);
  REQUIRE(adam.fit(train_set, &test_set).epochs.back().test_accuracy >= 0.85);
}

TEST_CASE("image_trainer refuses bad inputs with sentences", "[train][image_trainer][errors]") {
  const auto train_set = tiny_images(64, 5);
  const optim::momentum opt{.lr = 0.05f};
  using trainer = train::image_trainer<models::resnet>;

  auto uneven = options_for(3);  // 32 images do not split over 3 workers
  REQUIRE_THROWS_WITH(trainer(tiny_resnet(), opt, uneven),
                      Catch::Contains("must split evenly over 3 workers"));
  REQUIRE_THROWS_WITH(trainer(tiny_resnet(), optim::momentum{.lr = 0.0f}, options_for(2)),
                      Catch::Contains("learning rate must be positive"));
  REQUIRE_THROWS_WITH(trainer(tiny_resnet(), optim::momentum{.lr = NAN}, options_for(2)),
                      Catch::Contains("learning rate must be positive"));
  REQUIRE_THROWS_WITH(trainer(tiny_resnet(), opt, options_for(2), 2),
                      Catch::Contains("local rank 2 outside the 2 workers"));
  {
    trainer multi_process(tiny_resnet(), opt, options_for(2), 0);
    REQUIRE_THROWS_WITH(multi_process.fit(train_set),
                        Catch::Contains("call fit(transport, train, test) on every process"));
  }

  trainer t(tiny_resnet(), opt, options_for(2));
  auto wide = train_set;
  wide.images = matrix<float>(64, 100);
  REQUIRE_THROWS_WITH(t.fit(wide), Catch::Contains("training images have 100 values each but "
                                                   "the model reads 64"));
  auto bad_label = train_set;
  bad_label.labels[7] = 3;
  REQUIRE_THROWS_WITH(t.fit(bad_label),
                      Catch::Contains("training label 7 is 3 but the model has 3 classes"));
  REQUIRE_THROWS_WITH(t.fit(train_set, &bad_label), Catch::Contains("test label 7 is 3"));
  auto short_labels = train_set;
  short_labels.labels.resize(10);
  REQUIRE_THROWS_WITH(t.fit(short_labels), Catch::Contains("64 images but 10 labels"));
  const auto too_few = tiny_images(16, 6);
  REQUIRE_THROWS_WITH(t.fit(too_few), Catch::Contains("fewer than one global batch of 32"));

  auto augmented = options_for(2);
  augmented.augment = data::augment_options{};
  trainer needs_shape(tiny_resnet(), opt, augmented);
  auto shapeless = train_set;
  shapeless.height = 0;
  REQUIRE_THROWS_WITH(needs_shape.fit(shapeless),
                      Catch::Contains("augmentation needs the images' shape"));
}

// A small image-classification problem for the image trainer's tests: 8 × 8 one-channel
// images in 3 classes (which third of the image holds a bright bar), with noise, and a
// ResNet-8 sized for them.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "strata/core/rng.hpp"
#include "strata/data/idx.hpp"
#include "strata/models/resnet.hpp"
#include "support/skip.hpp"

namespace strata_test {

inline strata::models::resnet::config tiny_resnet() {
  strata::models::resnet::config c;
  c.blocks_per_stage = 1;
  c.widths = {4, 8, 8};
  c.input = {8, 8, 1};
  c.classes = 3;
  // The sanitizer builds compile at -O0, where the Winograd engine's Eigen transforms run
  // hundreds of times slower than at -O2 (train/test_image_trainer: 2.4 s in the main stage,
  // over 600 s under ASan). There the trainer tests' nets run on oneDNN's uninstrumented
  // kernels, as before Winograd was the default; nn/test_conv_layers and models/test_resnet
  // check the Winograd engine under the sanitizers.
  if (sanitized() && strata::nn::onednn_available) c.conv = strata::nn::conv_engine::onednn;
  return c;
}

/// `count` images; image i's class and noise are pure functions of (seed, i).
inline strata::data::image_dataset tiny_images(std::size_t count, std::uint64_t seed) {
  strata::data::image_dataset set;
  set.height = 8;
  set.width = 8;
  set.classes = 3;
  set.images = strata::matrix<float>(count, 64);
  set.labels.resize(count);
  const strata::counter_rng rng{seed, 7};
  for (std::size_t i = 0; i < count; ++i) {
    const auto label = static_cast<std::uint8_t>(rng.uniform(3 * i) * 3.0) % 3;
    set.labels[i] = label;
    for (std::size_t y = 0; y < 8; ++y)
      for (std::size_t x = 0; x < 8; ++x) {
        const bool bar = y >= 3 && y < 5 &&
                         (x / 3 == static_cast<std::size_t>(label) || (label == 2 && x == 8 - 1));
        const double noise = rng.uniform(1000 + 64 * i + 8 * y + x) - 0.5;
        set.images(i, 8 * y + x) = static_cast<float>((bar ? 1.0 : -0.5) + 5.0 * noise);
      }
  }
  return set;
}

/// ‖a − b‖ / ‖b‖ in float64 (a.size() must equal b.size()).
inline double relative_distance(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    diff += (double{a[i]} - b[i]) * (double{a[i]} - b[i]);
    norm += double{b[i]} * b[i];
  }
  return std::sqrt(diff / norm);
}

}  // namespace strata_test

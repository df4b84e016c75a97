/// @file augment.hpp
/// Random crop (shift within zero padding) and horizontal flip of images, keyed by
/// (seed, epoch, sample) so that every rank and every worker count sees the same augmented
/// sample.
///
/// ```cpp
/// const data::augmenter aug({28, 28, 1}, {.pad = 2, .fill = data::fashion_mnist_black});
/// aug.apply(train.images.row(i), image_out, epoch, i);  // i: the sample's dataset index
/// ```
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>

#include "strata/core/error.hpp"
#include "strata/core/rng.hpp"

namespace strata::data {

/// Size of one image stored row-major as H × W × C (HWC; C = 1 for Fashion-MNIST).
struct image_shape {
  std::size_t height = 28;
  std::size_t width = 28;
  std::size_t channels = 1;
  [[nodiscard]] constexpr std::size_t size() const noexcept { return height * width * channels; }
};

/// What `augmenter` does.
struct augment_options {
  /// Crop: the image is padded by `pad` pixels of `fill` on every side and an H × W window is
  /// cut at a uniformly random offset in [0, 2·pad]² (pad = 0: no crop).
  std::size_t pad = 2;
  /// Flip: mirrored left–right with probability ½.
  bool flip = true;
  /// Value of the padding pixels — the normalised value of black for normalised images.
  float fill = 0.0f;
  std::uint64_t seed = 0;
};

/// Random crop + flip. The choice for a sample is a pure function of
/// (seed, epoch, sample index): `counter_rng{seed, epoch}` at that index, so the augmentation
/// does not depend on which worker or rank reads the sample, or in which order — data-parallel
/// training stays equal to single-worker training on the global batch.
/// Cost: one pass over the image. Value type; const members are thread-safe.
class augmenter {
 public:
  /// Throws `errc::invalid_argument` for an empty shape or a padding ≥ the image side.
  augmenter(image_shape shape, augment_options options) : shape_(shape), options_(options) {
    STRATA_EXPECTS(shape.height > 0 && shape.width > 0 && shape.channels > 0,
                   "data::augmenter: image shape must be positive, got ", shape.height, "x",
                   shape.width, "x", shape.channels);
    STRATA_EXPECTS(options.pad < shape.height && options.pad < shape.width, "data::augmenter: pad ",
                   options.pad, " must be smaller than the image (", shape.height, "x", shape.width,
                   ")");
  }

  [[nodiscard]] const image_shape& shape() const noexcept { return shape_; }
  [[nodiscard]] const augment_options& options() const noexcept { return options_; }

  /// The transform chosen for `sample` in `epoch`: crop offsets (each in [0, 2·pad]) and flip.
  struct choice {
    std::size_t dy = 0, dx = 0;
    bool flipped = false;
  };
  [[nodiscard]] choice choose(std::uint64_t epoch, std::uint64_t sample) const noexcept {
    const auto bits = counter_rng{options_.seed, mix_ids(epoch, 0xA06u)}.block(sample);
    const std::size_t span = 2 * options_.pad + 1;
    return {bits[0] % span, bits[1] % span, options_.flip && (bits[2] & 1u) != 0};
  }

  /// out ← the augmented `in` (both shape().size() values, HWC). `in` and `out` must not
  /// overlap. Throws `errc::size_mismatch` for wrong sizes.
  void apply(std::span<const float> in, std::span<float> out, std::uint64_t epoch,
             std::uint64_t sample) const {
    const std::size_t n = shape_.size();
    if (in.size() != n || out.size() != n)
      fail(errc::size_mismatch, cat("data::augmenter::apply: image of ", shape_.height, "x",
                                    shape_.width, "x", shape_.channels, " needs ", n,
                                    " values in and out, got ", in.size(), " and ", out.size()));
    const auto [dy, dx, flipped] = choose(epoch, sample);
    const std::size_t H = shape_.height, W = shape_.width, C = shape_.channels, p = options_.pad;
    for (std::size_t y = 0; y < H; ++y) {
      // Output row y shows padded row y + dy, i.e. source row y + dy − p.
      float* row = out.data() + y * W * C;
      const std::size_t sy_p = y + dy;
      if (sy_p < p || sy_p - p >= H) {
        std::fill(row, row + W * C, options_.fill);
        continue;
      }
      const float* src = in.data() + (sy_p - p) * W * C;
      for (std::size_t x = 0; x < W; ++x) {
        // Before the flip, output column x shows source column x + dx − p.
        const std::size_t sx_p = x + dx;
        float* dst = row + (flipped ? W - 1 - x : x) * C;
        if (sx_p < p || sx_p - p >= W)
          std::fill(dst, dst + C, options_.fill);
        else
          std::copy_n(src + (sx_p - p) * C, C, dst);
      }
    }
  }

 private:
  image_shape shape_;
  augment_options options_;
};

}  // namespace strata::data

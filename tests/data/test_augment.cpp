#include <catch2/catch.hpp>

#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/data/augment.hpp"

using namespace strata;
using namespace strata::data;

namespace {
/// The textbook definition, written plainly: pad the image with `fill`, cut the H × W window
/// at (dy, dx), then mirror it left–right when flipped.
std::vector<float> reference(const std::vector<float>& in, image_shape s, std::size_t pad,
                             float fill, augmenter::choice c) {
  const std::size_t PH = s.height + 2 * pad, PW = s.width + 2 * pad, C = s.channels;
  std::vector<float> padded(PH * PW * C, fill);
  for (std::size_t y = 0; y < s.height; ++y)
    for (std::size_t x = 0; x < s.width; ++x)
      for (std::size_t ch = 0; ch < C; ++ch)
        padded[((y + pad) * PW + (x + pad)) * C + ch] = in[(y * s.width + x) * C + ch];
  std::vector<float> out(s.size());
  for (std::size_t y = 0; y < s.height; ++y)
    for (std::size_t x = 0; x < s.width; ++x) {
      const std::size_t ox = c.flipped ? s.width - 1 - x : x;
      for (std::size_t ch = 0; ch < C; ++ch)
        out[(y * s.width + ox) * C + ch] = padded[((y + c.dy) * PW + (x + c.dx)) * C + ch];
    }
  return out;
}

std::vector<float> ramp(image_shape s) {
  std::vector<float> v(s.size());
  std::iota(v.begin(), v.end(), 1.0f);
  return v;
}
}  // namespace

TEST_CASE("augmenter equals pad-crop-flip written plainly", "[data][augment]") {
  for (const image_shape s : {image_shape{28, 28, 1}, image_shape{5, 7, 3}, image_shape{4, 4, 2}})
    for (const std::size_t pad : {0u, 1u, 2u, 3u}) {
      if (pad >= s.height || pad >= s.width) continue;
      const augmenter aug(s, {.pad = pad, .flip = true, .fill = -0.81f, .seed = 5});
      const auto in = ramp(s);
      std::vector<float> out(s.size(), 1e30f);  // poisoned: unwritten values would show
      for (std::uint64_t epoch = 0; epoch < 3; ++epoch)
        for (std::uint64_t sample = 0; sample < 60; ++sample) {
          aug.apply(in, out, epoch, sample);
          const auto c = aug.choose(epoch, sample);
          REQUIRE(c.dy <= 2 * pad);
          REQUIRE(c.dx <= 2 * pad);
          REQUIRE(out == reference(in, s, pad, -0.81f, c));
        }
    }
}

TEST_CASE("augmenter: pad 0 without flip is the identity", "[data][augment]") {
  const image_shape s{6, 9, 2};
  const augmenter aug(s, {.pad = 0, .flip = false});
  const auto in = ramp(s);
  std::vector<float> out(s.size());
  for (std::uint64_t i = 0; i < 20; ++i) {
    aug.apply(in, out, 1, i);
    REQUIRE(out == in);
  }
}

TEST_CASE("augmenter choices depend on (seed, epoch, sample) only and cover every offset",
          "[data][augment]") {
  const image_shape s{28, 28, 1};
  const augmenter a(s, {.pad = 2, .flip = true, .seed = 9});
  const augmenter same(s, {.pad = 2, .flip = true, .seed = 9});
  const augmenter other(s, {.pad = 2, .flip = true, .seed = 10});
  std::set<std::size_t> dys, dxs;
  int flips = 0, differ_epoch = 0, differ_seed = 0;
  constexpr int samples = 4000;
  for (std::uint64_t i = 0; i < samples; ++i) {
    const auto c = a.choose(3, i);
    const auto d = same.choose(3, i);
    REQUIRE((c.dy == d.dy && c.dx == d.dx && c.flipped == d.flipped));
    dys.insert(c.dy);
    dxs.insert(c.dx);
    flips += c.flipped ? 1 : 0;
    const auto e = a.choose(4, i);
    differ_epoch += (e.dy != c.dy || e.dx != c.dx || e.flipped != c.flipped) ? 1 : 0;
    const auto o = other.choose(3, i);
    differ_seed += (o.dy != c.dy || o.dx != c.dx || o.flipped != c.flipped) ? 1 : 0;
  }
  REQUIRE(dys == std::set<std::size_t>{0, 1, 2, 3, 4});
  REQUIRE(dxs == std::set<std::size_t>{0, 1, 2, 3, 4});
  // 4000 fair coin flips: mean 2000, sd 32; ±200 is > 6 sd.
  REQUIRE(flips > 1800);
  REQUIRE(flips < 2200);
  // Another epoch or seed changes the transform of most samples (1 − 1/50 would be equal).
  REQUIRE(differ_epoch > samples * 9 / 10);
  REQUIRE(differ_seed > samples * 9 / 10);
}

TEST_CASE("augmenter rejects bad shapes and sizes", "[data][augment]") {
  REQUIRE_THROWS_WITH(augmenter({0, 28, 1}, {}), Catch::Contains("image shape must be positive"));
  REQUIRE_THROWS_WITH(augmenter({4, 28, 1}, {.pad = 4}),
                      Catch::Contains("pad 4 must be smaller than the image (4x28)"));
  const augmenter aug({28, 28, 1}, {});
  std::vector<float> in(784), out(783);
  try {
    aug.apply(in, out, 0, 0);
    FAIL("no error");
  } catch (const error& e) {
    REQUIRE(e.code() == errc::size_mismatch);
    REQUIRE_THAT(e.what(), Catch::Contains("needs 784 values in and out, got 784 and 783"));
  }
}

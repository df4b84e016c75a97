/// @file feature_map.hpp
/// Image batches for the convolutional layers: the NHWC layout, its shape type, shape checks
/// and the deterministic sample-chunk parallel loop the layers share.
///
/// A batch of N feature maps of shape (height, width, channels) is a contiguous row-major
/// `matrix_view` of N·height·width rows (one per pixel, sample-major, then row, then column)
/// and `channels` columns: NHWC. A batch of 1-channel 28 × 28 images stored N × 784 is the
/// same memory viewed as (N·784) × 1.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"

namespace strata::nn {

/// Shape of one sample's feature map: height × width pixels of `channels` values each.
struct map_shape {
  std::size_t height = 0;
  std::size_t width = 0;
  std::size_t channels = 0;

  [[nodiscard]] constexpr std::size_t pixels() const noexcept { return height * width; }
  [[nodiscard]] constexpr std::size_t size() const noexcept { return height * width * channels; }
  friend constexpr bool operator==(const map_shape&, const map_shape&) = default;
};

namespace detail {

/// Pixels per parallel task of the image layers. Tasks are whole samples, as many as reach
/// this many pixels; the split depends on the shape alone, never on the thread count, so
/// every result is bitwise identical with 1 or N threads.
inline constexpr std::size_t pixels_per_task = 1024;

/// Samples per task for maps of `pixels` pixels.
constexpr std::size_t samples_per_task(std::size_t pixels) noexcept {
  return std::max<std::size_t>(1,
                               (pixels_per_task + pixels - 1) / std::max<std::size_t>(pixels, 1));
}

/// Number of samples in `v`, a batch of maps of `shape`; throws `errc::size_mismatch` naming
/// `what` unless v is (N·height·width) × channels and contiguous.
template <class T>
std::size_t batch_of(std::string_view where, std::string_view what, matrix_view<T> v,
                     const map_shape& shape) {
  if (v.cols() != shape.channels || v.rows() % shape.pixels() != 0 || !v.contiguous()) [[unlikely]]
    fail(errc::size_mismatch,
         cat(where, ": ", what, " is ", v.rows(), " x ", v.cols(),
             (v.contiguous() ? "" : " (strided)"), " but must be a contiguous (N*", shape.height,
             "*", shape.width, ") x ", shape.channels, " NHWC batch of ", shape.height, "x",
             shape.width, "x", shape.channels, " maps"));
  return v.rows() / shape.pixels();
}

/// Throws `errc::size_mismatch` unless `v` holds exactly `batch` maps of `shape`.
template <class T>
void expect_maps(std::string_view where, std::string_view what, matrix_view<T> v,
                 const map_shape& shape, std::size_t batch) {
  const std::size_t n = batch_of(where, what, v, shape);
  if (n != batch) [[unlikely]]
    fail(errc::size_mismatch, cat(where, ": ", what, " holds ", n, " samples but the input holds ",
                                  batch, "; pass the same batch to every argument"));
}

/// Number of chunks `samples_per_task` splits `batch` samples of `pixels` pixels into.
constexpr std::size_t sample_chunks(std::size_t batch, std::size_t pixels) noexcept {
  const std::size_t per = samples_per_task(pixels);
  return (batch + per - 1) / per;
}

/// Calls `body(chunk, first_sample, count)` for each fixed chunk of [0, batch) (see
/// `samples_per_task`), in parallel (oneTBB, simple partitioner, one chunk per task) when
/// there are several. `body` must write only memory owned by its chunk.
template <class Body>
void for_sample_chunks(std::size_t batch, std::size_t pixels, Body&& body) {
  const std::size_t per = samples_per_task(pixels);
  const std::size_t chunks = sample_chunks(batch, pixels);
  const auto run = [&](std::size_t c) {
    const std::size_t first = c * per;
    body(c, first, std::min(per, batch - first));
  };
  if (chunks < 2) {
    for (std::size_t c = 0; c < chunks; ++c)
      run(c);
    return;
  }
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, chunks, 1),
      [&](const tbb::blocked_range<std::size_t>& r) {
        for (std::size_t c = r.begin(); c != r.end(); ++c)
          run(c);
      },
      tbb::simple_partitioner{});
}

}  // namespace detail

}  // namespace strata::nn

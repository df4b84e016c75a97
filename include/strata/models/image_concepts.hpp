/// @file image_concepts.hpp
/// The `image_model` contract: an image classifier whose parameters are one flat buffer and
/// whose batch norm can be synchronised over data-parallel workers (models::resnet).
#pragma once

#include <concepts>
#include <cstddef>
#include <span>
#include <vector>

#include "strata/core/matrix.hpp"
#include "strata/nn/batch_norm.hpp"

namespace strata::models {

/// An image classifier trained by `train::image_trainer`.
///
/// - `typename M::config`, `M(config)`: replicas built from one config are identical.
/// - `m.input_size()` (pixels × channels of one image, NHWC) and `m.classes()`.
/// - `m.parameters()`, `m.gradients()` → `std::span<float>`: every parameter and its gradient
///   in one flat buffer each (one allreduce per step).
/// - `m.forward(images, logits)` (batch × input_size → batch × classes) and
///   `m.backward(dlogits)` (overwrites gradients()).
/// - `m.set_mode(nn::mode)` (train: batch statistics; eval: running statistics) and
///   `m.set_bn_sync(reducer)`: batch norm sums its per-batch statistics through `reducer`
///   (an allreduce over the workers), so N workers normalise as one worker on the global batch.
/// - `m.running_statistics()` → the state beside the parameters (batch norm's running mean and
///   variance) as floats, and `m.set_running_statistics(values)` (checkpoints).
template <class M>
concept image_model = std::constructible_from<M, const typename M::config&> &&
    requires(M& m, const M& cm, matrix_view<const float> images, matrix_view<float> logits,
             matrix_view<const float> dlogits, nn::stat_reducer reducer) {
  { cm.input_size() } -> std::convertible_to<std::size_t>;
  { cm.classes() } -> std::convertible_to<std::size_t>;
  { m.parameters() } -> std::same_as<std::span<float>>;
  { m.gradients() } -> std::same_as<std::span<float>>;
  m.forward(images, logits);
  m.backward(dlogits);
  m.set_mode(nn::mode::train);
  m.set_bn_sync(reducer);
  { m.running_statistics() } -> std::convertible_to<std::vector<float>>;
  m.set_running_statistics(std::span<const float>{});
};

}  // namespace strata::models

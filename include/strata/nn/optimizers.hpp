/// @file optimizers.hpp
/// Dense optimizers stepping over a model's flat parameter and gradient spans.
#pragma once

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"

namespace strata::nn {

/// A dense optimizer: `o.step(params, grads)` updates every parameter from its gradient (same
/// sizes). Optimizer state is sized on the first step and bound to that size from then on.
/// Every update is element-wise, so results never depend on the thread count.
template <class O>
concept dense_optimizer = requires(O& o, std::span<float> params, std::span<const float> grads) {
  { O::name } -> std::convertible_to<const char*>;
  o.step(params, grads);
};

namespace detail {
/// Values per parallel task of an optimizer step; smaller spans run on the calling thread.
inline constexpr std::size_t optimizer_chunk = 1 << 15;

inline void check_step(const char* name, std::span<float> params, std::span<const float> grads,
                       std::size_t state_size) {
  if (params.size() != grads.size())
    fail(errc::size_mismatch, cat(name, "::step: ", params.size(), " parameters but ", grads.size(),
                                  " gradients; pass the model's two flat spans"));
  if (state_size != 0 && state_size != params.size())
    fail(errc::size_mismatch, cat(name, "::step: optimizer state was sized for ", state_size,
                                  " parameters on its first step but now got ", params.size(),
                                  "; use one optimizer per parameter buffer"));
}

/// Calls body(first, last) over fixed chunks of [0, n), in parallel for large n.
template <class Body>
void for_chunks(std::size_t n, Body&& body) {
  if (n <= optimizer_chunk) {
    body(std::size_t{0}, n);
    return;
  }
  tbb::parallel_for(
      tbb::blocked_range<std::size_t>(0, n, optimizer_chunk),
      [&](const tbb::blocked_range<std::size_t>& r) { body(r.begin(), r.end()); },
      tbb::simple_partitioner{});
}
}  // namespace detail

/// Plain SGD: `p −= lr · g`. No state. Cost: one multiply-add per parameter.
struct sgd {
  static constexpr const char* name = "sgd";
  float lr = 0.01f;  ///< learning rate

  void step(std::span<float> params, std::span<const float> grads) const {
    detail::check_step(name, params, grads, 0);
    detail::for_chunks(params.size(), [&](std::size_t first, std::size_t last) {
      for (std::size_t i = first; i < last; ++i)
        params[i] -= lr * grads[i];
    });
  }
};

/// Adagrad (Duchi et al., 2011), accumulator starting at 0:
/// `h += g²;  p −= lr · g / (sqrt(h) + eps)`. State: one float per parameter.
/// Cost: one sqrt and one division per parameter. Not thread-safe (owns state).
struct adagrad {
  static constexpr const char* name = "adagrad";
  float lr = 0.01f;    ///< learning rate
  float eps = 1e-10f;  ///< added to sqrt(h)

  adagrad() = default;
  explicit adagrad(float learning_rate, float epsilon = 1e-10f) : lr(learning_rate), eps(epsilon) {}

  void step(std::span<float> params, std::span<const float> grads) {
    detail::check_step(name, params, grads, sum_.size());
    if (sum_.size() != params.size()) sum_ = aligned_buffer<float>(params.size());
    detail::for_chunks(params.size(), [&](std::size_t first, std::size_t last) {
      for (std::size_t i = first; i < last; ++i) {
        sum_[i] += grads[i] * grads[i];
        params[i] -= lr * grads[i] / (std::sqrt(sum_[i]) + eps);
      }
    });
  }
  /// The accumulated squared gradients (empty before the first step).
  [[nodiscard]] std::span<const float> state() const noexcept { return sum_.span(); }

 private:
  aligned_buffer<float> sum_;
};

/// Adam (Kingma & Ba, 2015) with bias correction, t counting steps from 1:
/// ```
/// m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²
/// p −= lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + eps)
/// ```
/// State: two floats per parameter and the step count. Not thread-safe (owns state).
struct adam {
  static constexpr const char* name = "adam";
  float lr = 0.001f;     ///< learning rate
  float beta1 = 0.9f;    ///< decay of the first moment
  float beta2 = 0.999f;  ///< decay of the second moment
  float eps = 1e-8f;     ///< added to the corrected sqrt(v)

  adam() = default;
  explicit adam(float learning_rate, float b1 = 0.9f, float b2 = 0.999f, float epsilon = 1e-8f)
      : lr(learning_rate), beta1(b1), beta2(b2), eps(epsilon) {}

  void step(std::span<float> params, std::span<const float> grads) {
    detail::check_step(name, params, grads, m_.size());
    if (m_.size() != params.size()) {
      m_ = aligned_buffer<float>(params.size());
      v_ = aligned_buffer<float>(params.size());
      steps_ = 0;
    }
    ++steps_;
    const double t = static_cast<double>(steps_);
    const auto c1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), t)));
    const auto c2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), t)));
    detail::for_chunks(params.size(), [&](std::size_t first, std::size_t last) {
      for (std::size_t i = first; i < last; ++i) {
        const float g = grads[i];
        m_[i] = beta1 * m_[i] + (1.0f - beta1) * g;
        v_[i] = beta2 * v_[i] + (1.0f - beta2) * g * g;
        params[i] -= lr * (m_[i] * c1) / (std::sqrt(v_[i] * c2) + eps);
      }
    });
  }
  [[nodiscard]] std::uint64_t steps() const noexcept { return steps_; }

 private:
  aligned_buffer<float> m_;
  aligned_buffer<float> v_;
  std::uint64_t steps_ = 0;
};

static_assert(dense_optimizer<sgd>);
static_assert(dense_optimizer<adagrad>);
static_assert(dense_optimizer<adam>);

}  // namespace strata::nn

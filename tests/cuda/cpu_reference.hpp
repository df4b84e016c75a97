/// @file cpu_reference.hpp
/// CPU references for the CUDA tests, compiled by the host compiler (cpu_reference.cpp) so that
/// nvcc never parses Eigen / oneTBB: the strata CPU implementations behind plain-vector calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "strata/optim/adagrad.hpp"
#include "strata/optim/adam.hpp"
#include "strata/optim/ftrl.hpp"
#include "strata/optim/sgd.hpp"

namespace strata::cuda_test {

/// Weights and state of a table after updates.
struct table_result {
  std::vector<float> weights;
  std::vector<float> state;
};

/// embedding::local<O> with one table (rows × dim, uniform_init{seed}); applies
/// apply_gradients(0, keys[s], grads[s]) for each step s; returns weights and state.
table_result local_updates(const optim::sgd& o, std::uint64_t rows, std::size_t dim,
                           std::uint64_t seed, const std::vector<std::vector<std::uint64_t>>& keys,
                           const std::vector<std::vector<float>>& grads);
table_result local_updates(const optim::adagrad& o, std::uint64_t rows, std::size_t dim,
                           std::uint64_t seed, const std::vector<std::vector<std::uint64_t>>& keys,
                           const std::vector<std::vector<float>>& grads);
table_result local_updates(const optim::adam& o, std::uint64_t rows, std::size_t dim,
                           std::uint64_t seed, const std::vector<std::vector<std::uint64_t>>& keys,
                           const std::vector<std::vector<float>>& grads);
table_result local_updates(const optim::ftrl& o, std::uint64_t rows, std::size_t dim,
                           std::uint64_t seed, const std::vector<std::vector<std::uint64_t>>& keys,
                           const std::vector<std::vector<float>>& grads);

/// Initial weights of local<sgd> (rows × dim, uniform_init{seed}).
std::vector<float> initial_weights(std::uint64_t rows, std::size_t dim, std::uint64_t seed);

/// embedding::pool over the keys' rows of `weights` (rows × dim): bags × dim.
std::vector<float> pooled(const std::vector<float>& weights, std::size_t dim,
                          const std::vector<std::uint64_t>& keys,
                          const std::vector<std::uint64_t>& offsets, bool mean);
/// embedding::unpool: keys × dim.
std::vector<float> unpooled(const std::vector<float>& d_out, std::size_t dim,
                            const std::vector<std::uint64_t>& offsets, bool mean);

/// nn::relu / nn::sigmoid forward (y from x) and backward (dx from y, dy).
std::vector<float> relu_forward(const std::vector<float>& x);
std::vector<float> relu_backward(const std::vector<float>& y, const std::vector<float>& dy);
std::vector<float> sigmoid_forward(const std::vector<float>& x);
std::vector<float> sigmoid_backward(const std::vector<float>& y, const std::vector<float>& dy);
/// nn::bce_with_logits with reduction::mean; fills dlogits (scaled by grad_scale).
double bce(const std::vector<float>& logits, const std::vector<float>& labels,
           std::vector<float>& dlogits, float grad_scale);
/// nn::interaction forward: z (batch × d), emb[f] (batch × d) → batch × (d + (F+1)F/2).
std::vector<float> interaction_forward(std::size_t batch, std::size_t dim,
                                       const std::vector<float>& z,
                                       const std::vector<std::vector<float>>& emb);
/// nn::interaction backward: fills dz and demb[f].
void interaction_backward(std::size_t batch, std::size_t dim, const std::vector<float>& z,
                          const std::vector<std::vector<float>>& emb,
                          const std::vector<float>& dout, std::vector<float>& dz,
                          std::vector<std::vector<float>>& demb);

}  // namespace strata::cuda_test

// CPU references for the CUDA tests (see cpu_reference.hpp).
#include "cuda/cpu_reference.hpp"

#include <span>

#include "strata/embedding/local.hpp"
#include "strata/embedding/pooled.hpp"
#include "strata/nn/activations.hpp"
#include "strata/nn/interaction.hpp"
#include "strata/nn/loss.hpp"

namespace strata::cuda_test {
namespace {
template <class O>
table_result run_local(const O& o, std::uint64_t rows, std::size_t dim, std::uint64_t seed,
                       const std::vector<std::vector<std::uint64_t>>& keys,
                       const std::vector<std::vector<float>>& grads) {
  embedding::local<O> tab({{"t", rows, dim}}, o, embedding::uniform_init{seed});
  for (std::size_t s = 0; s < keys.size(); ++s)
    tab.apply_gradients(0, keys[s], {grads[s].data(), keys[s].size(), dim});
  table_result r;
  tab.for_each_row(0, [&](std::uint64_t, std::span<const float> w, std::span<const float> st) {
    r.weights.insert(r.weights.end(), w.begin(), w.end());
    r.state.insert(r.state.end(), st.begin(), st.end());
  });
  return r;
}
matrix_view<const float> view(const std::vector<float>& v, std::size_t rows, std::size_t cols) {
  return {v.data(), rows, cols};
}
matrix_view<float> view(std::vector<float>& v, std::size_t rows, std::size_t cols) {
  return {v.data(), rows, cols};
}
}  // namespace

table_result local_updates(const optim::sgd& o, std::uint64_t rows, std::size_t dim,
                           std::uint64_t seed, const std::vector<std::vector<std::uint64_t>>& keys,
                           const std::vector<std::vector<float>>& grads) {
  return run_local(o, rows, dim, seed, keys, grads);
}
table_result local_updates(const optim::adagrad& o, std::uint64_t rows, std::size_t dim,
                           std::uint64_t seed, const std::vector<std::vector<std::uint64_t>>& keys,
                           const std::vector<std::vector<float>>& grads) {
  return run_local(o, rows, dim, seed, keys, grads);
}
table_result local_updates(const optim::adam& o, std::uint64_t rows, std::size_t dim,
                           std::uint64_t seed, const std::vector<std::vector<std::uint64_t>>& keys,
                           const std::vector<std::vector<float>>& grads) {
  return run_local(o, rows, dim, seed, keys, grads);
}
table_result local_updates(const optim::ftrl& o, std::uint64_t rows, std::size_t dim,
                           std::uint64_t seed, const std::vector<std::vector<std::uint64_t>>& keys,
                           const std::vector<std::vector<float>>& grads) {
  return run_local(o, rows, dim, seed, keys, grads);
}

std::vector<float> initial_weights(std::uint64_t rows, std::size_t dim, std::uint64_t seed) {
  return run_local(optim::sgd{}, rows, dim, seed, {}, {}).weights;
}

std::vector<float> pooled(const std::vector<float>& weights, std::size_t dim,
                          const std::vector<std::uint64_t>& keys,
                          const std::vector<std::uint64_t>& offsets, bool mean) {
  std::vector<float> rows(keys.size() * dim);
  for (std::size_t i = 0; i < keys.size(); ++i)
    std::copy_n(weights.begin() + static_cast<std::ptrdiff_t>(keys[i] * dim), dim,
                rows.begin() + static_cast<std::ptrdiff_t>(i * dim));
  std::vector<float> out((offsets.size() - 1) * dim);
  embedding::pool(view(rows, keys.size(), dim), offsets,
                  mean ? embedding::pooling::mean : embedding::pooling::sum,
                  view(out, offsets.size() - 1, dim));
  return out;
}

std::vector<float> unpooled(const std::vector<float>& d_out, std::size_t dim,
                            const std::vector<std::uint64_t>& offsets, bool mean) {
  std::vector<float> out(offsets.back() * dim);
  embedding::unpool(view(d_out, offsets.size() - 1, dim), offsets,
                    mean ? embedding::pooling::mean : embedding::pooling::sum,
                    view(out, offsets.back(), dim));
  return out;
}

std::vector<float> relu_forward(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  nn::relu::forward(view(x, 1, x.size()), view(y, 1, y.size()));
  return y;
}
std::vector<float> relu_backward(const std::vector<float>& y, const std::vector<float>& dy) {
  std::vector<float> dx(y.size());
  nn::relu::backward(view(y, 1, y.size()), view(dy, 1, dy.size()), view(dx, 1, dx.size()));
  return dx;
}
std::vector<float> sigmoid_forward(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  nn::sigmoid::forward(view(x, 1, x.size()), view(y, 1, y.size()));
  return y;
}
std::vector<float> sigmoid_backward(const std::vector<float>& y, const std::vector<float>& dy) {
  std::vector<float> dx(y.size());
  nn::sigmoid::backward(view(y, 1, y.size()), view(dy, 1, dy.size()), view(dx, 1, dx.size()));
  return dx;
}
double bce(const std::vector<float>& logits, const std::vector<float>& labels,
           std::vector<float>& dlogits, float grad_scale) {
  dlogits.resize(logits.size());
  return nn::bce_with_logits(logits, labels, dlogits, grad_scale, nn::reduction::mean);
}

std::vector<float> interaction_forward(std::size_t batch, std::size_t dim,
                                       const std::vector<float>& z,
                                       const std::vector<std::vector<float>>& emb) {
  const nn::interaction op(emb.size(), dim);
  std::vector<matrix_view<const float>> e;
  for (const auto& v : emb)
    e.push_back(view(v, batch, dim));
  std::vector<float> out(batch * op.output_cols());
  op.forward(view(z, batch, dim), e, view(out, batch, op.output_cols()));
  return out;
}

void interaction_backward(std::size_t batch, std::size_t dim, const std::vector<float>& z,
                          const std::vector<std::vector<float>>& emb,
                          const std::vector<float>& dout, std::vector<float>& dz,
                          std::vector<std::vector<float>>& demb) {
  const nn::interaction op(emb.size(), dim);
  std::vector<matrix_view<const float>> e;
  for (const auto& v : emb)
    e.push_back(view(v, batch, dim));
  dz.assign(batch * dim, 0.0f);
  demb.assign(emb.size(), std::vector<float>(batch * dim));
  std::vector<matrix_view<float>> de;
  for (auto& v : demb)
    de.push_back(view(v, batch, dim));
  op.backward(view(z, batch, dim), e, view(dout, batch, op.output_cols()), view(dz, batch, dim),
              de);
}

}  // namespace strata::cuda_test

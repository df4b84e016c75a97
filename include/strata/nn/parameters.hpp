/// @file parameters.hpp
/// All dense parameters of a model, and their gradients, in one flat aligned buffer each, so
/// that an allreduce of the gradients (or a broadcast of the parameters) is a single call.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"
#include "strata/core/rng.hpp"

namespace strata::nn {

/// How a parameter block is initialised (a = half-width of a uniform interval):
/// - `zeros`: 0.
/// - `xavier_uniform`: U(−a, a), a = sqrt(6 / (fan_in + fan_out)) (Glorot & Bengio 2010);
///   used for linear weights.
/// - `fan_in_uniform`: U(−a, a), a = 1 / sqrt(fan_in) (PyTorch's default for linear biases).
enum class init_scheme { zeros, xavier_uniform, fan_in_uniform };

/// One named, contiguous block of the flat buffer: values [offset, offset + size).
struct param_block {
  std::string name;
  std::size_t offset = 0;
  std::size_t size = 0;
  init_scheme init = init_scheme::zeros;
  std::size_t fan_in = 0;
  std::size_t fan_out = 0;
};

/// The flat parameter and gradient buffers of one model.
///
/// Two phases: layers `add()` their blocks (in a fixed order: the block index is part of the
/// initialisation key), then `allocate(seed)` creates both 64-byte aligned buffers and fills
/// the parameters. Blocks tile [0, size()) with no gaps and no overlap. Layers keep only
/// offsets, so the set (and the model holding it) can be moved freely.
///
/// Initial value of element `e` of block `k`, exactly:
/// `counter_rng{seed, mix_ids(0x6e6e, k)}.uniform(e, −a, a)` with `a` from `init_scheme`
/// (0 for `zeros`). A pure function of (seed, block index, element): identical on every rank.
/// Cost of allocate: one Philox block per value. Not thread-safe.
class parameter_set {
 public:
  /// Registers a block of `size` values; returns its offset. Only before allocate().
  std::size_t add(std::string name, std::size_t size, init_scheme init, std::size_t fan_in = 0,
                  std::size_t fan_out = 0) {
    if (allocated_)
      fail(errc::invalid_argument, cat("parameter_set: cannot add block '", name,
                                       "' after allocate(); register every layer first"));
    const std::size_t offset = size_;
    blocks_.push_back({std::move(name), offset, size, init, fan_in, fan_out});
    size_ += size;
    return offset;
  }

  /// Allocates the parameter and gradient buffers (gradients zero) and initialises the
  /// parameters from `seed`.
  void allocate(std::uint64_t seed) {
    values_ = aligned_buffer<float>(size_);
    grads_ = aligned_buffer<float>(size_);
    allocated_ = true;
    reset(seed);
  }

  /// Re-initialises the parameters from `seed` (gradients untouched).
  void reset(std::uint64_t seed) {
    STRATA_EXPECTS(allocated_, "parameter_set: reset() before allocate()");
    for (std::size_t k = 0; k < blocks_.size(); ++k) {
      const param_block& b = blocks_[k];
      float* out = values_.data() + b.offset;
      const float a = half_width(b);
      const counter_rng rng{seed, mix_ids(0x6e6e, k)};
      for (std::size_t e = 0; e < b.size; ++e)
        out[e] = a == 0.0f ? 0.0f : rng.uniform(e, -a, a);
    }
  }

  /// Half-width of the initial interval of a block.
  [[nodiscard]] static float half_width(const param_block& b) noexcept {
    switch (b.init) {
      case init_scheme::zeros:
        return 0.0f;
      case init_scheme::xavier_uniform:
        return b.fan_in + b.fan_out == 0
                   ? 0.0f
                   : static_cast<float>(std::sqrt(6.0 / static_cast<double>(b.fan_in + b.fan_out)));
      case init_scheme::fan_in_uniform:
        return b.fan_in == 0 ? 0.0f
                             : static_cast<float>(1.0 / std::sqrt(static_cast<double>(b.fan_in)));
    }
    return 0.0f;
  }

  [[nodiscard]] bool allocated() const noexcept { return allocated_; }
  /// Total number of parameters (= values().size() = grads().size() once allocated).
  [[nodiscard]] std::size_t size() const noexcept { return size_; }
  [[nodiscard]] const std::vector<param_block>& blocks() const noexcept { return blocks_; }

  [[nodiscard]] std::span<float> values() noexcept { return values_.span(); }
  [[nodiscard]] std::span<const float> values() const noexcept { return values_.span(); }
  [[nodiscard]] std::span<float> grads() noexcept { return grads_.span(); }
  [[nodiscard]] std::span<const float> grads() const noexcept { return grads_.span(); }

 private:
  std::vector<param_block> blocks_;
  std::size_t size_ = 0;
  bool allocated_ = false;
  aligned_buffer<float> values_;
  aligned_buffer<float> grads_;
};

/// Where a linear layer's blocks lie in a parameter_set's flat buffers.
struct linear_blocks {
  std::size_t in = 0, out = 0, weight_offset = 0, bias_offset = 0;
};

/// Registers an `in` → `out` linear layer in `params`: "<name>.weight" (out × in,
/// xavier_uniform) then "<name>.bias" (out, fan_in_uniform). nn::linear and the GPU models
/// register their layers through this one function, so their flat buffers agree.
inline linear_blocks add_linear(parameter_set& params, std::size_t in, std::size_t out,
                                const std::string& name) {
  STRATA_EXPECTS(in > 0 && out > 0, "linear '", name, "': sizes must be positive, got ", in, " -> ",
                 out);
  linear_blocks b{in, out, 0, 0};
  b.weight_offset = params.add(name + ".weight", in * out, init_scheme::xavier_uniform, in, out);
  b.bias_offset = params.add(name + ".bias", out, init_scheme::fan_in_uniform, in, out);
  return b;
}

/// Registers the layers of an MLP whose widths are `widths` (input first, then each layer's
/// output), layer l as "<name>.<l>" (add_linear).
inline std::vector<linear_blocks> add_mlp(parameter_set& params,
                                          std::span<const std::size_t> widths,
                                          const std::string& name) {
  STRATA_EXPECTS(widths.size() >= 2, "mlp '", name,
                 "': needs at least an input and an output size, got ", widths.size(), " sizes");
  std::vector<linear_blocks> layers;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l)
    layers.push_back(add_linear(params, widths[l], widths[l + 1], cat(name, ".", l)));
  return layers;
}

}  // namespace strata::nn

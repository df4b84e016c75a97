/// @file winograd_conv.hpp
/// conv2d's Winograd engine: 3×3, stride-1, padding-1 convolutions as Winograd's minimal
/// filtering F(4×4, 3×3) (Lavin & Gray, 2016) — forward, backward-data and backward-weights —
/// on the layer's own oneTBB chunks, with the products as Eigen GEMMs.
///
/// Each 4×4 output tile of a map comes from a 6×6 input tile d: Y = Aᵀ [U ⊙ V] A with
/// V = Bᵀ d B (input transform) and U = G g Gᵀ (weight transform, once per call). Summed over
/// input channels, the element-wise products become 36 GEMMs per chunk, one per position of
/// the 6×6 tile: M[p] (tiles × Cout) = V[p] (tiles × Cin) · U[p] (Cin × Cout). That is 36
/// multiply-adds per 16 outputs and channel pair instead of 144: 4× fewer flops than the
/// direct convolution (fewer when a map's edge leaves part-empty tiles: 14 and 7 wide maps
/// compute 16 and 8), for transforms that are additions and scalings of whole channel
/// vectors. The points are 0, ±1, ±2 (and ∞), as in cuDNN's and oneDNN's fp32 kernels; the
/// result differs from the direct convolution by rounding only (a few 1e-6 of the largest
/// output, ≤ 8e-6 on ResNet-20's shapes with unit-scale data; the tests bound it).
///
/// Backward is the exact gradient of that computation: with dZ = A dY Aᵀ per tile,
/// dU[p] = V[p]ᵀ · dZ[p] (a GEMM with the tiles as the inner dimension), dW = Gᵀ (Σ dU) G,
/// dV[p] = dZ[p] · U[p]ᵀ and dx = B dV Bᵀ, added back over the overlapping input tiles.
///
/// Determinism: every chunk is computed by one thread in a fixed order; the per-chunk dU
/// partials are summed in chunk order by the caller, so results are bitwise identical
/// whatever the thread count, as with the other engines.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cstddef>

#include <tbb/enumerable_thread_specific.h>

#include "strata/core/buffer.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/feature_map.hpp"

namespace strata::nn::detail {

/// The Winograd F(4×4, 3×3) convolution of one layer (3×3 window, stride 1, padding 1: the
/// output map has the input's size).
class winograd_conv {
 public:
  /// Outputs per tile side, inputs per tile side, positions of a transformed tile.
  static constexpr std::size_t tile = 4;
  static constexpr std::size_t alpha = tile + 2;
  static constexpr std::size_t positions = alpha * alpha;

  winograd_conv() = default;
  winograd_conv(map_shape in, std::size_t out_channels)
      : in_(in),
        out_channels_(out_channels),
        tiles_h_((in.height + tile - 1) / tile),
        tiles_w_((in.width + tile - 1) / tile) {}
  // A copy starts with empty scratch (a copy may run on another thread than the original).
  winograd_conv(const winograd_conv& other) : winograd_conv(other.in_, other.out_channels_) {}
  winograd_conv& operator=(const winograd_conv& other) {
    if (this != &other) *this = winograd_conv(other.in_, other.out_channels_);
    return *this;
  }
  winograd_conv(winograd_conv&&) noexcept = default;
  winograd_conv& operator=(winograd_conv&&) noexcept = default;
  ~winograd_conv() = default;

  /// Floats of a transformed weight (or weight-gradient partial): 36 · Cin · Cout.
  [[nodiscard]] std::size_t transformed_floats() const noexcept {
    return positions * in_.channels * out_channels_;
  }

  /// True for the geometry this engine computes: a 3×3 window, stride 1, padding 1.
  static constexpr bool applies(std::size_t kernel, std::size_t stride,
                                std::size_t padding) noexcept {
    return kernel == 3 && stride == 1 && padding == 1;
  }

  /// U = G g Gᵀ of every (output, input) channel pair from the layer's OHWI weights
  /// (Cout × 3·3·Cin), stored as 36 Cin × Cout row-major matrices. Called once per
  /// forward or backward call, before the chunks run.
  void load_weights(const float* w) const {
    const std::size_t C = in_.channels, K = out_channels_;
    if (u_.size() != transformed_floats()) u_ = aligned_buffer<float>(transformed_floats());
    for (std::size_t k = 0; k < K; ++k)
      for (std::size_t c = 0; c < C; ++c) {
        std::array<float, 9> g{};
        for (std::size_t q = 0; q < 9; ++q)
          g[q] = w[(k * 9 + q) * C + c];
        std::array<float, 3 * alpha> t{};  // G g: alpha × 3
        for (std::size_t j = 0; j < 3; ++j)
          weight_1d(&g[j], 3, &t[j], 3);
        std::array<float, positions> u{};  // (G g) Gᵀ
        for (std::size_t i = 0; i < alpha; ++i)
          weight_1d(&t[i * 3], 1, &u[i * alpha], 1);
        for (std::size_t p = 0; p < positions; ++p)
          u_[(p * C + c) * K + k] = u[p];
      }
  }

  /// y ← conv(x) (+ b) for `count` samples (x: count maps of H×W×Cin, y: of H×W×Cout, NHWC).
  /// Runs on the calling thread; needs `load_weights` first.
  void forward(const float* x, const float* bias, float* y, std::size_t count) const {
    const std::size_t T = count * tiles_per_sample();
    const std::size_t C = in_.channels, K = out_channels_;
    auto& s = scratch(T);
    input_transform(x, count, s.v.data(), T);
    for (std::size_t p = 0; p < positions; ++p)
      rows(s.m.data() + p * T * K, T, K).noalias() =
          rows(s.v.data() + p * T * C, T, C) * rows(u_.data() + p * C * K, C, K);
    output_transform(s.m.data(), T, bias, y, count);
  }

  /// For `count` samples: writes this chunk's transformed weight gradient Σ_tiles V[p]ᵀ·dZ[p]
  /// to `du` (`transformed_floats()` values), the bias gradient (Σ dy per output channel) to
  /// `db` unless null, and dx (overwritten) unless null. Needs `load_weights` first when dx
  /// is wanted.
  void backward(const float* x, const float* dy, float* dx, float* du, float* db,
                std::size_t count) const {
    const std::size_t T = count * tiles_per_sample();
    const std::size_t C = in_.channels, K = out_channels_;
    auto& s = scratch(T);
    input_transform(x, count, s.v.data(), T);
    gradient_transform(dy, count, s.m.data(), T);
    for (std::size_t p = 0; p < positions; ++p)
      rows(du + p * C * K, C, K).noalias() =
          rows(s.v.data() + p * T * C, T, C).transpose() * rows(s.m.data() + p * T * K, T, K);
    if (db != nullptr) {
      Eigen::Map<Eigen::ArrayXf> sum(db, static_cast<Eigen::Index>(K));
      sum.setZero();
      const std::size_t pixels = count * in_.pixels();
      for (std::size_t r = 0; r < pixels; ++r)  // row after row: one vector add each
        sum += Eigen::Map<const Eigen::ArrayXf>(dy + r * K, static_cast<Eigen::Index>(K));
    }
    if (dx == nullptr) return;
    for (std::size_t p = 0; p < positions; ++p)  // dV overwrites V
      rows(s.v.data() + p * T * C, T, C).noalias() =
          rows(s.m.data() + p * T * K, T, K) * rows(u_.data() + p * C * K, C, K).transpose();
    data_transform(s.v.data(), T, dx, count);
  }

  /// dW (OHWI, Cout × 3·3·Cin, overwritten) = Gᵀ dU G from the summed transformed gradient.
  void store_weight_gradient(const float* du, float* dw) const {
    const std::size_t C = in_.channels, K = out_channels_;
    for (std::size_t k = 0; k < K; ++k)
      for (std::size_t c = 0; c < C; ++c) {
        std::array<float, positions> d{};
        for (std::size_t p = 0; p < positions; ++p)
          d[p] = du[(p * C + c) * K + k];
        std::array<float, 3 * alpha> t{};  // Gᵀ dU: 3 × alpha
        for (std::size_t j = 0; j < alpha; ++j)
          weight_gradient_1d(&d[j], alpha, &t[j], alpha);
        std::array<float, 9> g{};  // (Gᵀ dU) G
        for (std::size_t a = 0; a < 3; ++a)
          weight_gradient_1d(&t[a * alpha], 1, &g[a * 3], 1);
        for (std::size_t q = 0; q < 9; ++q)
          dw[(k * 9 + q) * C + c] = g[q];
      }
  }

 private:
  using rows_map = Eigen::Map<row_major_matrix<float>>;
  template <int L>
  using lanes = Eigen::Array<float, L, 1>;
  /// Channels handled per vector step; the channels after the last full step go one by one.
  static constexpr int lane_width = 8;

  struct scratch_space {
    aligned_buffer<float> v;      // 36 × tiles × Cin: V, then dV
    aligned_buffer<float> m;      // 36 × tiles × Cout: M, or dZ
    aligned_buffer<float> zeros;  // max(Cin, Cout) zeros: what a tile reads outside the map
    aligned_buffer<float> sink;   // where a tile writes outside the map (values unused)
  };

  // The 1-D transforms of F(4, 3), on `alpha` (or 3, or `tile`) values `in[0], in[s], …`
  // written to `out[0], out[o], …`; the 2-D transforms apply them to the rows, then to the
  // columns. T is a float or a vector of channels. Always inlined: called as functions (GCC
  // at -O2 keeps them out of line), the calls cost as much as the arithmetic.

  /// out = Bᵀ in (alpha → alpha).
  template <class T>
  [[gnu::always_inline]] static void input_1d(const T* in, std::size_t s, T* out, std::size_t o) {
    const T& d0 = in[0];
    const T& d1 = in[s];
    const T& d2 = in[2 * s];
    const T& d3 = in[3 * s];
    const T& d4 = in[4 * s];
    const T& d5 = in[5 * s];
    out[0] = 4.0f * d0 - 5.0f * d2 + d4;
    out[o] = (d3 + d4) - 4.0f * (d1 + d2);
    out[2 * o] = (d4 - d3) + 4.0f * (d1 - d2);
    out[3 * o] = (d4 - d2) + 2.0f * (d3 - d1);
    out[4 * o] = (d4 - d2) - 2.0f * (d3 - d1);
    out[5 * o] = 4.0f * d1 - 5.0f * d3 + d5;
  }
  /// out = Aᵀ in (alpha → tile).
  template <class T>
  [[gnu::always_inline]] static void output_1d(const T* in, std::size_t s, T* out, std::size_t o) {
    const T& m0 = in[0];
    const T& m1 = in[s];
    const T& m2 = in[2 * s];
    const T& m3 = in[3 * s];
    const T& m4 = in[4 * s];
    const T& m5 = in[5 * s];
    out[0] = m0 + (m1 + m2) + (m3 + m4);
    out[o] = (m1 - m2) + 2.0f * (m3 - m4);
    out[2 * o] = (m1 + m2) + 4.0f * (m3 + m4);
    out[3 * o] = (m1 - m2) + 8.0f * (m3 - m4) + m5;
  }
  /// out = G in (3 → alpha).
  template <class T>
  [[gnu::always_inline]] static void weight_1d(const T* in, std::size_t s, T* out, std::size_t o) {
    const T& g0 = in[0];
    const T& g1 = in[s];
    const T& g2 = in[2 * s];
    out[0] = g0 / 4.0f;
    out[o] = -(g0 + g1 + g2) / 6.0f;
    out[2 * o] = -(g0 - g1 + g2) / 6.0f;
    out[3 * o] = g0 / 24.0f + g1 / 12.0f + g2 / 6.0f;
    out[4 * o] = g0 / 24.0f - g1 / 12.0f + g2 / 6.0f;
    out[5 * o] = g2;
  }
  /// out = A in (tile → alpha): the transpose of `output_1d`.
  template <class T>
  [[gnu::always_inline]] static void gradient_1d(const T* in, std::size_t s, T* out,
                                                 std::size_t o) {
    const T& e0 = in[0];
    const T& e1 = in[s];
    const T& e2 = in[2 * s];
    const T& e3 = in[3 * s];
    out[0] = e0;
    out[o] = (e0 + e2) + (e1 + e3);
    out[2 * o] = (e0 + e2) - (e1 + e3);
    out[3 * o] = (e0 + 4.0f * e2) + 2.0f * (e1 + 4.0f * e3);
    out[4 * o] = (e0 + 4.0f * e2) - 2.0f * (e1 + 4.0f * e3);
    out[5 * o] = e3;
  }
  /// out = B in (alpha → alpha): the transpose of `input_1d`.
  template <class T>
  [[gnu::always_inline]] static void data_1d(const T* in, std::size_t s, T* out, std::size_t o) {
    const T& v0 = in[0];
    const T& v1 = in[s];
    const T& v2 = in[2 * s];
    const T& v3 = in[3 * s];
    const T& v4 = in[4 * s];
    const T& v5 = in[5 * s];
    out[0] = 4.0f * v0;
    out[o] = 4.0f * (v2 - v1) + 2.0f * (v4 - v3) + 4.0f * v5;
    out[2 * o] = -5.0f * v0 - 4.0f * (v1 + v2) - (v3 + v4);
    out[3 * o] = (v1 - v2) + 2.0f * (v3 - v4) - 5.0f * v5;
    out[4 * o] = v0 + (v1 + v2) + (v3 + v4);
    out[5 * o] = v5;
  }
  /// out = Gᵀ in (alpha → 3): the transpose of `weight_1d`.
  template <class T>
  [[gnu::always_inline]] static void weight_gradient_1d(const T* in, std::size_t s, T* out,
                                                        std::size_t o) {
    const T& w0 = in[0];
    const T& w1 = in[s];
    const T& w2 = in[2 * s];
    const T& w3 = in[3 * s];
    const T& w4 = in[4 * s];
    const T& w5 = in[5 * s];
    out[0] = w0 / 4.0f - (w1 + w2) / 6.0f + (w3 + w4) / 24.0f;
    out[o] = (w2 - w1) / 6.0f + (w3 - w4) / 12.0f;
    out[2 * o] = (w3 + w4 - w1 - w2) / 6.0f + w5;
  }

  [[nodiscard]] std::size_t tiles_per_sample() const noexcept { return tiles_h_ * tiles_w_; }

  static rows_map rows(float* data, std::size_t r, std::size_t c) {
    return {data, static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)};
  }
  static Eigen::Map<const row_major_matrix<float>> rows(const float* data, std::size_t r,
                                                        std::size_t c) {
    return {data, static_cast<Eigen::Index>(r), static_cast<Eigen::Index>(c)};
  }

  scratch_space& scratch(std::size_t tiles) const {
    auto& s = scratch_.local();
    if (s.v.size() < positions * tiles * in_.channels)
      s.v = aligned_buffer<float>(positions * tiles * in_.channels);
    if (s.m.size() < positions * tiles * out_channels_)
      s.m = aligned_buffer<float>(positions * tiles * out_channels_);
    if (s.zeros.size() < std::max(in_.channels, out_channels_)) {
      s.zeros = aligned_buffer<float>(std::max(in_.channels, out_channels_));
      s.sink = aligned_buffer<float>(std::max(in_.channels, out_channels_));
    }
    return s;
  }

  /// Calls `body(tile, sample, th, tw)` for every tile of `count` samples, in tile order.
  template <class Body>
  void for_tiles(std::size_t count, Body&& body) const {
    std::size_t t = 0;
    for (std::size_t n = 0; n < count; ++n)
      for (std::size_t th = 0; th < tiles_h_; ++th)
        for (std::size_t tw = 0; tw < tiles_w_; ++tw, ++t)
          body(t, n, th, tw);
  }

  /// Calls `step.template operator()<L>(c0)` over [0, channels) in vector steps, then singly.
  template <class Step>
  static void for_channel_steps(std::size_t channels, Step&& step) {
    std::size_t c0 = 0;
    for (; c0 + lane_width <= channels; c0 += lane_width)
      step.template operator()<lane_width>(c0);
    for (; c0 < channels; ++c0)
      step.template operator()<1>(c0);
  }

  // The 2-D transforms run over whole channel vectors (NHWC: a pixel's channels are
  // contiguous), `lane_width` channels per step, branch-free: a tile's pixels outside the map
  // read the scratch's zeros and write to its sink. Their fixed-count loops are unrolled
  // (`#pragma GCC unroll`, which clang honours too): left as loops, their counters and address
  // arithmetic cost more instructions than the transform's vector arithmetic.

  /// Pointers to the pixels of input tile (n, th, tw) (`alpha`² of them; `outside` for those
  /// in the padding).
  template <class Pointer>
  void input_tile_pixels(Pointer base, std::size_t n, std::size_t th, std::size_t tw,
                         Pointer outside, std::array<Pointer, positions>& at) const {
    const std::size_t H = in_.height, W = in_.width, C = in_.channels;
    for (std::size_t i = 0; i < alpha; ++i)
      for (std::size_t j = 0; j < alpha; ++j) {
        const std::size_t ih = tile * th + i, iw = tile * tw + j;  // + 1 (the padding)
        at[i * alpha + j] = ih >= 1 && ih <= H && iw >= 1 && iw <= W
                                ? base + ((n * H + ih - 1) * W + iw - 1) * C
                                : outside;
      }
  }
  /// Pointers to the pixels of output tile (n, th, tw) (`tile`² of them).
  template <class Pointer>
  void output_tile_pixels(Pointer base, std::size_t n, std::size_t th, std::size_t tw,
                          Pointer outside, std::array<Pointer, tile * tile>& at) const {
    const std::size_t H = in_.height, W = in_.width, K = out_channels_;
    for (std::size_t i = 0; i < tile; ++i)
      for (std::size_t j = 0; j < tile; ++j) {
        const std::size_t oh = tile * th + i, ow = tile * tw + j;
        at[i * tile + j] = oh < H && ow < W ? base + ((n * H + oh) * W + ow) * K : outside;
      }
  }

  /// V[p][t] = (Bᵀ d B)[p] of every input tile d (zero outside the map).
  void input_transform(const float* x, std::size_t count, float* v, std::size_t T) const {
    const std::size_t C = in_.channels;
    const float* zeros = scratch_.local().zeros.data();
    for_tiles(count, [&](std::size_t t, std::size_t n, std::size_t th, std::size_t tw) {
      std::array<const float*, positions> src;
      input_tile_pixels(x, n, th, tw, zeros, src);
      for_channel_steps(C, [&]<int L>(std::size_t c0) {
        using vec = lanes<L>;
        std::array<vec, positions> d, r;
#pragma GCC unroll 36
        for (std::size_t i = 0; i < alpha; ++i) {  // rows: d B
          std::array<vec, alpha> row;
#pragma GCC unroll 36
          for (std::size_t j = 0; j < alpha; ++j)
            row[j] = Eigen::Map<const vec>(src[i * alpha + j] + c0);
          input_1d(row.data(), 1, &r[i * alpha], 1);
        }
#pragma GCC unroll 36
        for (std::size_t j = 0; j < alpha; ++j)  // columns: Bᵀ (d B)
          input_1d(&r[j], alpha, &d[j], alpha);
        float* const out = v + t * C + c0;
#pragma GCC unroll 36
        for (std::size_t p = 0; p < positions; ++p)
          Eigen::Map<vec>(out + p * T * C) = d[p];
      });
    });
  }

  /// y = Aᵀ M A (+ b) of every tile, the pixels inside the map written.
  void output_transform(const float* m, std::size_t T, const float* bias, float* y,
                        std::size_t count) const {
    const std::size_t K = out_channels_;
    auto& s = scratch_.local();
    const float* b = bias != nullptr ? bias : s.zeros.data();
    for_tiles(count, [&](std::size_t t, std::size_t n, std::size_t th, std::size_t tw) {
      std::array<float*, tile * tile> dst;
      output_tile_pixels(y, n, th, tw, s.sink.data(), dst);
      for_channel_steps(K, [&]<int L>(std::size_t c0) {
        using vec = lanes<L>;
        std::array<vec, positions> q;
        const float* const in = m + t * K + c0;
#pragma GCC unroll 36
        for (std::size_t p = 0; p < positions; ++p)
          q[p] = Eigen::Map<const vec>(in + p * T * K);
        std::array<vec, tile * alpha> r;  // columns: Aᵀ M, tile × alpha
#pragma GCC unroll 36
        for (std::size_t j = 0; j < alpha; ++j)
          output_1d(&q[j], alpha, &r[j], alpha);
        std::array<vec, tile * tile> o;  // rows: (Aᵀ M) A
#pragma GCC unroll 36
        for (std::size_t i = 0; i < tile; ++i)
          output_1d(&r[i * alpha], 1, &o[i * tile], 1);
        const vec bv = Eigen::Map<const vec>(b + c0);
#pragma GCC unroll 36
        for (std::size_t k = 0; k < tile * tile; ++k)
          Eigen::Map<vec>(dst[k] + c0) = o[k] + bv;
      });
    });
  }

  /// dZ[p][t] = (A dY Aᵀ)[p] of every output-gradient tile (zero outside the map).
  void gradient_transform(const float* dy, std::size_t count, float* dz, std::size_t T) const {
    const std::size_t K = out_channels_;
    const float* zeros = scratch_.local().zeros.data();
    for_tiles(count, [&](std::size_t t, std::size_t n, std::size_t th, std::size_t tw) {
      std::array<const float*, tile * tile> src;
      output_tile_pixels(dy, n, th, tw, zeros, src);
      for_channel_steps(K, [&]<int L>(std::size_t c0) {
        using vec = lanes<L>;
        std::array<vec, tile * tile> e;
#pragma GCC unroll 36
        for (std::size_t q = 0; q < tile * tile; ++q)
          e[q] = Eigen::Map<const vec>(src[q] + c0);
        std::array<vec, alpha * tile> r;  // columns: A dY, alpha × tile
#pragma GCC unroll 36
        for (std::size_t j = 0; j < tile; ++j)
          gradient_1d(&e[j], tile, &r[j], tile);
        std::array<vec, positions> z;  // rows: (A dY) Aᵀ
#pragma GCC unroll 36
        for (std::size_t i = 0; i < alpha; ++i)
          gradient_1d(&r[i * tile], 1, &z[i * alpha], 1);
        float* const out = dz + t * K + c0;
#pragma GCC unroll 36
        for (std::size_t p = 0; p < positions; ++p)
          Eigen::Map<vec>(out + p * T * K) = z[p];
      });
    });
  }

  /// dx = Σ_tiles B dV Bᵀ over the overlapping input tiles (dx of the `count` samples is
  /// overwritten; tiles are added in tile order).
  void data_transform(const float* dv, std::size_t T, float* dx, std::size_t count) const {
    const std::size_t C = in_.channels;
    float* const sink = scratch_.local().sink.data();
    std::fill(dx, dx + count * in_.size(), 0.0f);
    for_tiles(count, [&](std::size_t t, std::size_t n, std::size_t th, std::size_t tw) {
      std::array<float*, positions> dst;
      input_tile_pixels(dx, n, th, tw, sink, dst);
      for_channel_steps(C, [&]<int L>(std::size_t c0) {
        using vec = lanes<L>;
        std::array<vec, positions> q, r;
        const float* const in = dv + t * C + c0;
#pragma GCC unroll 36
        for (std::size_t p = 0; p < positions; ++p)
          q[p] = Eigen::Map<const vec>(in + p * T * C);
#pragma GCC unroll 36
        for (std::size_t j = 0; j < alpha; ++j)  // columns: B dV
          data_1d(&q[j], alpha, &r[j], alpha);
#pragma GCC unroll 36
        for (std::size_t i = 0; i < alpha; ++i)  // rows: (B dV) Bᵀ
          data_1d(&r[i * alpha], 1, &q[i * alpha], 1);
#pragma GCC unroll 36
        for (std::size_t p = 0; p < positions; ++p)
          Eigen::Map<vec>(dst[p] + c0) += q[p];
      });
    });
  }

  map_shape in_{};
  std::size_t out_channels_ = 0;
  std::size_t tiles_h_ = 0;
  std::size_t tiles_w_ = 0;
  mutable aligned_buffer<float> u_;
  mutable tbb::enumerable_thread_specific<scratch_space> scratch_;
};

}  // namespace strata::nn::detail

/// @file onednn_conv.hpp
/// conv2d's oneDNN engine: forward, backward-data and backward-weights primitives on NHWC
/// sub-batches, called single-threaded inside the layer's own oneTBB chunks.
///
/// Compiled only when the build found oneDNN (`STRATA_HAS_ONEDNN`, set on the strata target
/// by CMake when `libdnnl-dev` is installed); otherwise conv2d has only its im2col engine.
///
/// Threads: one pool runs the machine. Debian's oneDNN runs its kernels on OpenMP; each call
/// here first sets the calling thread's OpenMP thread count to 1 (the runtime's
/// `omp_set_num_threads`, looked up once with dlsym, so nothing links libgomp directly), so
/// a oneDNN primitive executes on the oneTBB worker that calls it and no OpenMP team is
/// started. Primitives are created on the layer's calling thread under the same setting (a
/// oneDNN kernel chooses its blocking for the thread count it is created with).
///
/// Determinism: each chunk is one single-threaded primitive call on a fixed sub-batch (the
/// split depends on the shape alone), the per-chunk weight-gradient partials are summed in
/// chunk order, so results are bitwise identical whatever the thread count — as with im2col.
#pragma once

#ifdef STRATA_HAS_ONEDNN

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstddef>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>

#include <tbb/enumerable_thread_specific.h>

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"
#include "strata/nn/detail/onednn.hpp"
#include "strata/nn/feature_map.hpp"

namespace strata::nn::detail {

/// Geometry of one convolution layer, as conv2d knows it.
struct conv_geometry {
  map_shape in;
  map_shape out;
  std::size_t kernel = 3;
  std::size_t stride = 1;
  std::size_t padding = 1;
  bool bias = false;
};

/// The oneDNN primitives of one layer for sub-batches of one size.
struct onednn_conv_plan {
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data backward_data;
  dnnl::convolution_backward_weights backward_weights;
  dnnl::memory::desc src, dst;
  dnnl::memory::desc forward_weights, data_weights, diff_weights;
  std::size_t scratch_bytes = 0;
};

/// oneDNN convolution of one layer. Copies start without cached primitives (a copy may run
/// on another thread at the same time as the original).
class onednn_conv {
 public:
  explicit onednn_conv(const conv_geometry& g) : geometry_(g) {}
  onednn_conv(const onednn_conv& other) : geometry_(other.geometry_) {}
  onednn_conv& operator=(const onednn_conv& other) {
    if (this != &other) *this = onednn_conv(other.geometry_);
    return *this;
  }
  onednn_conv(onednn_conv&&) noexcept = default;
  onednn_conv& operator=(onednn_conv&&) noexcept = default;
  ~onednn_conv() = default;

  /// Prepares the primitives for sub-batches of `full` and of `tail` samples (cached). False
  /// when oneDNN offers only its reference kernel for this shape on this machine, or the two
  /// sizes would want different weight layouts (conv2d then uses im2col).
  [[nodiscard]] bool prepare(std::size_t full, std::size_t tail) {
    const onednn_conv_plan* a = plan_for(full);
    const onednn_conv_plan* b = tail == 0 ? a : plan_for(tail);
    return a != nullptr && b != nullptr && a->forward_weights == b->forward_weights &&
           a->data_weights == b->data_weights && a->diff_weights == b->diff_weights;
  }

  /// Floats of a weight-gradient partial (the backward primitive's own layout, padding
  /// included) for sub-batches of `samples`; `prepare(samples)` must have returned true.
  [[nodiscard]] std::size_t diff_weight_floats(std::size_t samples) {
    return plan_for(samples)->diff_weights.get_size() / sizeof(float);
  }

  /// Reorder the user's OHWI weights into the layout the forward (backward-data) primitive
  /// reads; done once per layer call, shared by its chunks.
  void load_forward_weights(const float* ohwi, std::size_t samples) {
    onednn_on_this_thread_only();
    reorder_into(ohwi, plan_for(samples)->forward_weights, forward_weights_);
  }
  void load_backward_data_weights(const float* ohwi, std::size_t samples) {
    onednn_on_this_thread_only();
    reorder_into(ohwi, plan_for(samples)->data_weights, data_weights_);
  }

  /// y ← conv(x) (+ b) for `samples` samples (pointers at the chunk's first sample).
  void forward(const float* x, const float* bias, float* y, std::size_t samples) {
    onednn_on_this_thread_only();
    const onednn_conv_plan& p = *plan_for(samples);
    auto scratch = scratchpad(p);
    const auto& engine = onednn_engine();
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(p.src, engine, const_cast<float*>(x))},
        {DNNL_ARG_WEIGHTS, dnnl::memory(p.forward_weights, engine, forward_weights_.data())},
        {DNNL_ARG_DST, dnnl::memory(p.dst, engine, y)},
        {DNNL_ARG_SCRATCHPAD, scratch}};
    if (geometry_.bias)
      args.emplace(DNNL_ARG_BIAS, dnnl::memory(bias_desc(), engine, const_cast<float*>(bias)));
    p.forward.execute(onednn_stream(), args);
  }

  /// dx ← conv_backward_data(dy) for `samples` samples (weights from
  /// `load_backward_data_weights`).
  void backward_data(const float* dy, float* dx, std::size_t samples) {
    onednn_on_this_thread_only();
    const onednn_conv_plan& p = *plan_for(samples);
    const auto& engine = onednn_engine();
    p.backward_data.execute(
        onednn_stream(),
        {{DNNL_ARG_DIFF_DST, dnnl::memory(p.dst, engine, const_cast<float*>(dy))},
         {DNNL_ARG_WEIGHTS, dnnl::memory(p.data_weights, engine, data_weights_.data())},
         {DNNL_ARG_DIFF_SRC, dnnl::memory(p.src, engine, dx)},
         {DNNL_ARG_SCRATCHPAD, scratchpad(p)}});
  }

  /// Writes this sub-batch's dW (the primitive's layout, `diff_weight_floats` values) and db
  /// (Cout values, when the layer has a bias) into `dw` / `db`.
  void backward_weights(const float* x, const float* dy, float* dw, float* db,
                        std::size_t samples) {
    onednn_on_this_thread_only();
    const onednn_conv_plan& p = *plan_for(samples);
    const auto& engine = onednn_engine();
    std::unordered_map<int, dnnl::memory> args{
        {DNNL_ARG_SRC, dnnl::memory(p.src, engine, const_cast<float*>(x))},
        {DNNL_ARG_DIFF_DST, dnnl::memory(p.dst, engine, const_cast<float*>(dy))},
        {DNNL_ARG_DIFF_WEIGHTS, dnnl::memory(p.diff_weights, engine, dw)},
        {DNNL_ARG_SCRATCHPAD, scratchpad(p)}};
    if (geometry_.bias) args.emplace(DNNL_ARG_DIFF_BIAS, dnnl::memory(bias_desc(), engine, db));
    p.backward_weights.execute(onednn_stream(), args);
  }

  /// Reorders a weight gradient in the backward primitive's layout into OHWI.
  void store_weight_gradient(const float* primitive_layout, float* ohwi, std::size_t samples) {
    onednn_on_this_thread_only();
    const onednn_conv_plan& p = *plan_for(samples);
    const auto& engine = onednn_engine();
    dnnl::memory from(p.diff_weights, engine, const_cast<float*>(primitive_layout));
    dnnl::memory to(user_weights_desc(), engine, ohwi);
    dnnl::reorder(from, to).execute(onednn_stream(), from, to);
  }

 private:
  using tag = dnnl::memory::format_tag;
  using data_type = dnnl::memory::data_type;

  [[nodiscard]] dnnl::memory::dims weight_dims() const {
    const auto k = static_cast<dnnl::memory::dim>(geometry_.kernel);
    return {static_cast<dnnl::memory::dim>(geometry_.out.channels),
            static_cast<dnnl::memory::dim>(geometry_.in.channels), k, k};
  }
  [[nodiscard]] dnnl::memory::desc user_weights_desc() const {
    return {weight_dims(), data_type::f32, tag::ohwi};
  }
  [[nodiscard]] dnnl::memory::desc bias_desc() const {
    return {{static_cast<dnnl::memory::dim>(geometry_.out.channels)}, data_type::f32, tag::a};
  }

  /// The cached plan for `samples`, created on first use; null when only oneDNN's reference
  /// kernel (or none) implements the shape.
  const onednn_conv_plan* plan_for(std::size_t samples) {
    if (const auto it = plans_.find(samples); it != plans_.end())
      return it->second ? &*it->second : nullptr;
    onednn_on_this_thread_only();
    auto& slot = plans_[samples];
    try {
      slot = make_plan(samples);
    } catch (const dnnl::error&) {
      slot.reset();  // no implementation for this shape: conv2d falls back to im2col
    }
    return slot ? &*slot : nullptr;
  }

  [[nodiscard]] std::optional<onednn_conv_plan> make_plan(std::size_t samples) const {
    using dim = dnnl::memory::dim;
    const auto& g = geometry_;
    const auto& engine = onednn_engine();
    const dim n = static_cast<dim>(samples);
    const dim stride = static_cast<dim>(g.stride), pad = static_cast<dim>(g.padding);
    // oneDNN's right padding makes (in + left + right − kernel) / stride + 1 = out exactly. It
    // would be negative where the last window stops short of the input's end: oneDNN 2.6
    // accepts that, but its strided 1x1 kernel then writes past its scratchpad (valgrind), so
    // such layers run on im2col.
    const dim end_h = (static_cast<dim>(g.out.height) - 1) * stride + static_cast<dim>(g.kernel) -
                      static_cast<dim>(g.in.height) - pad;
    const dim end_w = (static_cast<dim>(g.out.width) - 1) * stride + static_cast<dim>(g.kernel) -
                      static_cast<dim>(g.in.width) - pad;
    if (end_h < 0 || end_w < 0) return std::nullopt;
    const dnnl::memory::desc src({n, static_cast<dim>(g.in.channels), static_cast<dim>(g.in.height),
                                  static_cast<dim>(g.in.width)},
                                 data_type::f32, tag::nhwc);
    const dnnl::memory::desc dst({n, static_cast<dim>(g.out.channels),
                                  static_cast<dim>(g.out.height), static_cast<dim>(g.out.width)},
                                 data_type::f32, tag::nhwc);
    // Weights in the layout each primitive prefers (a fixed OHWI layout gets the reference
    // kernel, ~500× slower); the layer reorders its OHWI weights into it once per call.
    const dnnl::memory::desc any_weights(weight_dims(), data_type::f32, tag::any);
    const dnnl::memory::dims strides{stride, stride}, left{pad, pad}, right{end_h, end_w};
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    const auto algo = dnnl::algorithm::convolution_direct;

    const auto forward_desc =
        g.bias
            ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src,
                                              any_weights, bias_desc(), dst, strides, left, right)
            : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src,
                                              any_weights, dst, strides, left, right);
    const dnnl::convolution_forward::primitive_desc forward_pd(forward_desc, attr, engine);
    const dnnl::convolution_backward_data::primitive_desc data_pd(
        {algo, src, any_weights, dst, strides, left, right}, attr, engine, forward_pd);
    const auto weights_desc =
        g.bias ? dnnl::convolution_backward_weights::desc(algo, src, any_weights, bias_desc(), dst,
                                                          strides, left, right)
               : dnnl::convolution_backward_weights::desc(algo, src, any_weights, dst, strides,
                                                          left, right);
    const dnnl::convolution_backward_weights::primitive_desc weights_pd(weights_desc, attr, engine,
                                                                        forward_pd);
    const auto reference = [](const char* impl) {
      return std::string_view(impl).starts_with("ref");
    };
    if (reference(forward_pd.impl_info_str()) || reference(data_pd.impl_info_str()) ||
        reference(weights_pd.impl_info_str()))
      return std::nullopt;
    onednn_conv_plan p{.forward = dnnl::convolution_forward(forward_pd),
                       .backward_data = dnnl::convolution_backward_data(data_pd),
                       .backward_weights = dnnl::convolution_backward_weights(weights_pd),
                       .src = src,
                       .dst = dst,
                       .forward_weights = forward_pd.weights_desc(),
                       .data_weights = data_pd.weights_desc(),
                       .diff_weights = weights_pd.diff_weights_desc()};
    p.scratch_bytes =
        std::max({forward_pd.scratchpad_desc().get_size(), data_pd.scratchpad_desc().get_size(),
                  weights_pd.scratchpad_desc().get_size()});
    return p;
  }

  /// This thread's scratchpad, large enough for every primitive of `p`.
  dnnl::memory scratchpad(const onednn_conv_plan& p) {
    auto& buffer = scratch_.local();
    const std::size_t floats = (p.scratch_bytes + sizeof(float) - 1) / sizeof(float);
    if (buffer.size() < floats) buffer = aligned_buffer<float>(floats);
    const dnnl::memory::desc bytes({static_cast<dnnl::memory::dim>(p.scratch_bytes)}, data_type::u8,
                                   tag::a);
    return {bytes, onednn_engine(), buffer.data()};
  }

  void reorder_into(const float* ohwi, const dnnl::memory::desc& layout,
                    aligned_buffer<float>& out) {
    const std::size_t floats = layout.get_size() / sizeof(float);
    if (out.size() < floats) out = aligned_buffer<float>(floats);
    const auto& engine = onednn_engine();
    dnnl::memory from(user_weights_desc(), engine, const_cast<float*>(ohwi));
    dnnl::memory to(layout, engine, out.data());
    dnnl::reorder(from, to).execute(onednn_stream(), from, to);
  }

  conv_geometry geometry_;
  std::map<std::size_t, std::optional<onednn_conv_plan>> plans_;
  aligned_buffer<float> forward_weights_;
  aligned_buffer<float> data_weights_;
  tbb::enumerable_thread_specific<aligned_buffer<float>> scratch_;
};

}  // namespace strata::nn::detail

#endif  // STRATA_HAS_ONEDNN

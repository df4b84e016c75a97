/// @file dlrm.hpp
/// `cuda::dlrm`: DLRM's dense part computed on a GPU, behind the same `models::ctr_model`
/// interface as `models::dlrm` — so `train::trainer<cuda::dlrm, Storage, Communicator, …>` is
/// a GPU worker: embedding rows come from any storage (CPU tables or CPU parameter servers)
/// into pinned host memory and onto the device, the MLPs and the interaction run on cuBLAS and
/// strata's kernels, and dense and embedding gradients come back to the host where the
/// trainer sums, compresses and applies them exactly as for the CPU model.
///
/// This header is plain C++ (no CUDA headers): the trainer and the rest of a program include
/// it from ordinary .cpp files. The device code lives in `strata/cuda/dlrm_impl.cuh`, which
/// exactly ONE .cu file of the program must include (it defines `dlrm::forward`, `backward`
/// and the device state; including it twice is a duplicate-symbol link error, forgetting it an
/// undefined-symbol one). Link that .cu's target with `strata::cuda`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/embedding/concepts.hpp"
#include "strata/models/concepts.hpp"
#include "strata/models/dlrm_config.hpp"
#include "strata/nn/parameters.hpp"

namespace strata::cuda {

/// DLRM on one GPU: the model of `models::dlrm` (same configuration fields, same parameter
/// blocks in the same order, same initial values for the same seed — tested bitwise), plus
/// the device it runs on.
///
/// Per step (batch B, F tables of dim d, P dense parameters):
/// - forward: the dense features and the host parameters go up on the compute stream and the
///   bottom MLP starts, while the F·B·d embedding values (staged in a pinned buffer) go up on a
///   separate copy stream; an event makes the interaction wait for them; the top MLP follows;
///   B logits come back.
/// - backward: the top MLP and the interaction run; as soon as the embedding gradients exist
///   the copy stream brings them down (into pinned memory) while the compute stream runs the
///   bottom MLP's backward; then the P dense gradients come down.
/// The parameter and gradient buffers are registered with CUDA (page-locked in place,
/// cudaHostRegister), so those copies are DMA without staging; when the driver refuses the
/// registration (a page shared with memory registered elsewhere), they go through pinned
/// staging buffers instead (one host copy each).
///
/// Numerics: cuBLAS SGEMM (full fp32, no TF32) and kernels with fixed summation orders, so a
/// GPU run is bitwise repeatable on one device model; results differ from the CPU model's
/// Eigen products by rounding only (tested ≤ 1e-4 relative per value).
///
/// The device state (streams, cuBLAS handle, buffers) is created by the first forward on the
/// calling thread's behalf (on `config::device`): building a model, reading its tables and
/// parameters needs no GPU. A model is not thread-safe; use one per worker thread (several
/// models may share one device).
class dlrm {
 public:
  /// `models::dlrm::config` (models::dlrm_config), plus the CUDA device:
  /// `cuda::dlrm::config{cpu_config, device}`.
  struct config : models::dlrm_config {
    int device = 0;  ///< CUDA device index (cudaSetDevice) this model runs on
  };

  /// One linear layer's place in the flat buffers.
  using layer = nn::linear_blocks;

  dlrm() : dlrm(config{}) {}
  explicit dlrm(const config& c) : config_(c), state_(nullptr, &no_state) {
    models::detail::check_dlrm_config("cuda::dlrm::config", c);
    STRATA_EXPECTS(c.device >= 0,
                   "cuda::dlrm::config: device must be a CUDA device index >= 0, "
                   "got ",
                   c.device);
    const auto rows = models::detail::table_rows("cuda::dlrm", c.table_rows, c.sparse_features);
    for (std::size_t f = 0; f < c.sparse_features; ++f)
      tables_.push_back({cat("C", f + 1), rows[f], c.embedding_dim});
    // models::dlrm's layout (models::dlrm_layers, registered by nn::add_mlp as nn::mlp does).
    const models::dlrm_layers layers(c);
    bottom_ = nn::add_mlp(params_, layers.bottom, "bottom");
    top_ = nn::add_mlp(params_, layers.top, "top");
    params_.allocate(c.seed);
  }
  /// Movable (a model in a container); not move-assignable: the device state refers to this
  /// model's host buffers.
  dlrm(dlrm&&) noexcept = default;
  dlrm& operator=(dlrm&&) = delete;
  dlrm(const dlrm&) = delete;
  dlrm& operator=(const dlrm&) = delete;
  ~dlrm() = default;

  [[nodiscard]] const config& get_config() const noexcept { return config_; }
  /// Tables "C1" … "C<F>", each of dim embedding_dim (as models::dlrm).
  [[nodiscard]] std::vector<embedding::table_spec> tables() const { return tables_; }
  [[nodiscard]] std::size_t dense_features() const noexcept { return config_.dense_features; }
  [[nodiscard]] std::size_t sparse_features() const noexcept { return config_.sparse_features; }
  /// Table t ("C<t+1>") reads sparse column t.
  [[nodiscard]] std::size_t input_column(std::size_t t) const noexcept { return t; }
  /// Host copies of the parameters and gradients: the trainer reads and updates them between
  /// steps; forward uploads the parameters, backward downloads the gradients.
  [[nodiscard]] std::span<float> parameters() noexcept { return params_.values(); }
  [[nodiscard]] std::span<const float> parameters() const noexcept { return params_.values(); }
  [[nodiscard]] std::span<float> gradients() noexcept { return params_.grads(); }
  [[nodiscard]] std::span<const float> gradients() const noexcept { return params_.grads(); }
  [[nodiscard]] const nn::parameter_set& parameter_blocks() const noexcept { return params_; }
  [[nodiscard]] const std::vector<layer>& bottom_layers() const noexcept { return bottom_; }
  [[nodiscard]] const std::vector<layer>& top_layers() const noexcept { return top_; }
  /// Columns of the interaction's output (d + (F+1)F/2), the top MLP's input.
  [[nodiscard]] std::size_t interaction_cols() const noexcept {
    return models::dlrm_interaction_cols(config_.sparse_features, config_.embedding_dim);
  }

  /// As models::dlrm::forward (same checks, same errors), computed on the device.
  void forward(const models::ctr_inputs& in, std::span<float> logits);
  /// As models::dlrm::backward, computed on the device.
  void backward(std::span<const float> dlogits, std::span<const matrix_view<float>> embedded_grads);

 private:
  struct device_state;  // defined in dlrm_impl.cuh
  using state_deleter = void (*)(device_state*) noexcept;
  static void no_state(device_state*) noexcept {}
  /// The device state, created on first use (checks the device index).
  device_state& device();

  config config_;
  std::vector<embedding::table_spec> tables_;
  nn::parameter_set params_;
  std::vector<layer> bottom_, top_;
  std::size_t batch_ = 0;
  bool forwarded_ = false;
  /// Created by the first forward; destroyed (unregistering the host buffers) before params_.
  std::unique_ptr<device_state, state_deleter> state_;
};

static_assert(models::ctr_model<dlrm>);

}  // namespace strata::cuda

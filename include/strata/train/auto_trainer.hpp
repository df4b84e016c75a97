/// @file auto_trainer.hpp
/// `auto_trainer<Model, Optimizer, …>`: the trainer whose Communicator *and* matching Storage
/// are chosen at compile time from the model's sizes, for models whose shape is a type
/// (`models::static_dlrm<Shape>`, or any `ctr_model` with constexpr `embedding_bytes` and
/// `dense_bytes`).
///
/// ```cpp
/// using kaggle = strata::models::static_dlrm<strata::models::criteo_kaggle_dlrm>;
/// using my_trainer = strata::train::auto_trainer<kaggle, strata::optim::adagrad>;
/// // 2.16 GB of tables, 1.9 MB of MLPs: parameter_server<ps::sync> over
/// // embedding::sharded<adagrad, ps::sync>
/// my_trainer trainer(kaggle::shape_config(), strata::optim::adagrad{.lr = 0.02f}, options);
/// ```
///
/// The rule is `choose_strategy_kind` (strategy.hpp), the one `ctr_train --strategy auto`
/// applies at run time: parameter server when embeddings are ≥ 70% of the parameter bytes and
/// the DNN is ≤ 64 MiB, ring allreduce (tables replicated in `embedding::local`) when
/// embeddings are < 30%, hybrid otherwise.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "strata/comm/collectives.hpp"
#include "strata/comm/thread_world.hpp"
#include "strata/compress/identity.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/ps/consistency.hpp"
#include "strata/train/strategy.hpp"
#include "strata/train/trainer.hpp"

namespace strata::train {

/// A model whose parameter sizes are compile-time constants.
template <class M>
concept sized_model = requires {
  { M::embedding_bytes } -> std::convertible_to<std::uint64_t>;
  { M::dense_bytes } -> std::convertible_to<std::uint64_t>;
};

/// The Communicator and Storage the size rule gives `Model` with the tables' `Optimizer`.
template <sized_model Model, class Optimizer, class Consistency = ps::sync>
struct auto_composition {
  static constexpr strategy_kind kind =
      choose_strategy_kind(Model::embedding_bytes, Model::dense_bytes);
  using communicator = auto_strategy_t<Model::embedding_bytes, Model::dense_bytes, Consistency>;
  static_assert(kind != strategy_kind::allreduce || std::is_same_v<Consistency, ps::sync>,
                "auto_trainer: this model's sizes pick ring allreduce (embeddings < 30% of the "
                "parameters), which is bulk-synchronous: use ps::sync, or name a parameter-server "
                "communicator yourself with train::trainer");
  using storage = std::conditional_t<kind == strategy_kind::allreduce, embedding::local<Optimizer>,
                                     embedding::sharded<Optimizer, Consistency>>;
};

/// The trainer composed by the size rule (see the file's comment).
template <sized_model Model, class Optimizer, class Consistency = ps::sync,
          compress::compressor Compressor = compress::identity,
          comm::transport Transport = comm::thread_transport,
          optim::sparse_optimizer DenseOptimizer = optim::default_dense_t<Optimizer>>
using auto_trainer =
    trainer<Model, typename auto_composition<Model, Optimizer, Consistency>::storage,
            typename auto_composition<Model, Optimizer, Consistency>::communicator, Compressor,
            Transport, DenseOptimizer>;

}  // namespace strata::train

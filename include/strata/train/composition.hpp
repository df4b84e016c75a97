/// @file composition.hpp
/// What a CTR trainer is composed of, checked: `trainer_composition<Model, Storage,
/// Communicator, Compressor, Transport, DenseOptimizer>` turns the policy parameters into the
/// parts the step loop runs — the dense path (allreduce_dense or servers_dense), the sparse
/// path (replicated_rows or server_rows), the storage rebound to the transport and wire codec,
/// the codecs of each path — and refuses, with a sentence at compile time, a combination that
/// cannot work (tables on servers without sharded storage, two consistency policies, a
/// per-table optimizer for the dense parameters, a foreign allreduce without an endpoint, …).
#pragma once

#include <cstddef>
#include <type_traits>
#include <utility>

#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/compress/per_path.hpp"
#include "strata/embedding/sharded.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/ps/server.hpp"
#include "strata/train/dense_path.hpp"
#include "strata/train/sparse_path.hpp"
#include "strata/train/strategy.hpp"

namespace strata::train {

namespace detail {

template <class S>
concept sharded_storage = requires {
  typename S::client_type;
  typename S::server_type;
};

/// The consistency policy a Storage runs under (sharded storage), else void.
template <class S>
struct storage_consistency {
  using type = void;
};
template <sharded_storage S>
struct storage_consistency<S> {
  using type = typename S::consistency_type;
};

/// The endpoint type `Allreduce::subset(transport, member)` gives (a policy that runs on its
/// own communicator of the workers, e.g. mpi::native_allreduce), else nullptr_t.
template <class Allreduce, class Transport>
struct subset_endpoint {
  using type = std::nullptr_t;
};
template <class Allreduce, class Transport>
requires requires(Transport& t) {
  Allreduce::subset(t, true);
}
struct subset_endpoint<Allreduce, Transport> {
  using type = decltype(Allreduce::subset(std::declval<Transport&>(), true));
};

/// The storage type a worker really uses: sharded storage rebound to the trainer's transport and
/// the wire codec (its consistency must already be the communicator's); local storage as given.
template <class Storage, class Consistency, class Transport, class Codec, bool sharded>
struct resolved_storage {
  using type = Storage;
};
template <class Storage, class Consistency, class Transport, class Codec>
struct resolved_storage<Storage, Consistency, Transport, Codec, true> {
  using type = embedding::sharded<typename Storage::optimizer_type, Consistency, Transport, Codec>;
};

}  // namespace detail

/// The parts of `trainer<Model, Storage, Communicator, Compressor, Transport, DenseOptimizer>`
/// (see trainer.hpp for the parameters), with the compile-time checks of their combination.
template <class Model, class Storage, class Communicator, class Compressor, class Transport,
          class DenseOptimizer>
struct trainer_composition {
  using traits = communicator_traits<Communicator>;
  static constexpr bool on_ps = detail::sharded_storage<Storage>;
  static_assert(!(traits::embeddings_on_ps && !on_ps),
                "parameter_server and hybrid keep the embedding tables on parameter servers: use "
                "embedding::sharded<Optimizer> as the Storage");
  static_assert(!(!traits::embeddings_on_ps && on_ps),
                "ring_allreduce replicates the embedding tables on every worker: it needs local "
                "storage (embedding::local or embedding::hash_table), not embedding::sharded");
  static_assert(!std::is_same_v<DenseOptimizer, optim::no_dense_optimizer>,
                "a per-table optimizer (optim::table_groups) cannot update the dense parameters: "
                "name the trainer's DenseOptimizer (its sixth parameter), e.g. optim::adam");
  static_assert(optim::table_optimizer<typename Storage::optimizer_type>,
                "the Storage's optimizer_type must model optim::sparse_optimizer (or "
                "optim::per_table_optimizer, e.g. optim::table_groups)");
  static_assert(!(traits::dense_on_ps && !on_ps), "internal: dense on PS needs PS storage");
  static_assert(!on_ps || std::is_same_v<typename detail::storage_consistency<Storage>::type,
                                         typename traits::consistency>,
                "the Storage and the Communicator name different consistency policies: write the "
                "same one in both, e.g. embedding::sharded<Opt, ps::async> with "
                "parameter_server<ps::async> (the servers and the workers must agree on it)");
  /// The dense gradients are summed by another library's allreduce (hybrid<C,
  /// mpi::native_allreduce>) on an endpoint of the workers only.
  static constexpr bool foreign_allreduce =
      !traits::dense_on_ps && !std::is_same_v<typename traits::allreduce, comm::ring_allreduce>;
  using workers_endpoint_type =
      typename detail::subset_endpoint<typename traits::allreduce, Transport>::type;
  static_assert(!foreign_allreduce || !std::is_same_v<workers_endpoint_type, std::nullptr_t>,
                "hybrid<Consistency, Allreduce>: this Allreduce cannot make an endpoint of the "
                "workers from the trainer's Transport (it needs Allreduce::subset(transport, "
                "member)); mpi::native_allreduce runs one process per rank: use mpi::transport "
                "as the trainer's Transport and fit(transport, train, eval)");

  using model_type = Model;
  using optimizer_type = typename Storage::optimizer_type;  ///< the embedding tables'
  using dense_optimizer_type = DenseOptimizer;              ///< the dense parameters'
  using consistency_type = typename traits::consistency;
  using transport_type = Transport;
  /// The codec of each path (one Compressor for both, or compress::per_path<Dense, Push>).
  using dense_compressor_type = typename compress::path_compressors<Compressor>::dense;
  using push_compressor_type = typename compress::path_compressors<Compressor>::push;
  static_assert(!compress::path_compressors<Compressor>::split || !traits::dense_on_ps ||
                    std::is_same_v<dense_compressor_type, push_compressor_type>,
                "compress::per_path under parameter_server: the dense gradients are pushes to "
                "the servers there, so one codec carries both; name the same compressor twice "
                "or a plain one");
  static_assert(!compress::path_compressors<Compressor>::split || traits::uses_ps ||
                    std::is_same_v<push_compressor_type, compress::identity>,
                "compress::per_path under ring_allreduce: the embedding rows' gradients are "
                "exchanged lossless among the workers (no pushes), so the push codec must be "
                "compress::identity");
  using wire_codec_type = typename detail::wire_codec<push_compressor_type>::type;
  static constexpr bool error_feedback = detail::wire_codec<push_compressor_type>::feedback;
  using storage_type = typename detail::resolved_storage<Storage, consistency_type, transport_type,
                                                         wire_codec_type, on_ps>::type;
  /// The pushes travel lossless (identity on the wire).
  static constexpr bool lossless = std::is_same_v<wire_codec_type, compress::identity>;
  static constexpr const char* strategy_name = traits::name;
  /// The two acting parts of the Communicator: how the dense gradients are summed and applied,
  /// and where the embedding rows come from and their gradients go.
  using dense_path_type = std::conditional_t<
      traits::dense_on_ps, servers_dense,
      allreduce_dense<dense_compressor_type, DenseOptimizer, typename traits::allreduce>>;
  using sparse_path_type = std::conditional_t<on_ps, server_rows<storage_type, error_feedback>,
                                              replicated_rows<Storage>>;
  using server_type =
      ps::server<optimizer_type, consistency_type, wire_codec_type, dense_optimizer_type>;
  /// The dense path keeps a compressor residual (checkpoints carry it).
  static constexpr bool dense_residual = [] {
    if constexpr (traits::dense_on_ps)
      return false;
    else
      return dense_path_type::has_residual;
  }();
  /// A worker keeps a compressor residual (dense path) or push residuals (sparse path).
  static constexpr bool worker_residuals = dense_residual || (on_ps && error_feedback && !lossless);
};

}  // namespace strata::train

/// @file per_path.hpp
/// One compressor per path of a trainer: `per_path<Dense, Push>` names the codec of the dense
/// gradients' allreduce and the codec of the parameter-server pushes separately (a plain
/// compressor serves both).
#pragma once

#include <type_traits>

#include "strata/compress/concepts.hpp"

namespace strata::compress {

/// The trainer's Compressor parameter with a codec per path, e.g.
/// `per_path<error_feedback<int8_block<256>>, fp16>`: the hybrid strategy's dense allreduce in
/// int8 with error feedback, its embedding-row pushes in fp16. Under `parameter_server` the
/// dense gradients are pushes too (one codec), and the sparse exchange of `ring_allreduce` is
/// lossless: the trainer refuses a `per_path` that could not act as written.
template <compressor Dense, compressor Push>
struct per_path {
  using dense = Dense;  ///< the dense gradients' allreduce (allreduce_dense)
  using push = Push;    ///< the embedding rows' pushes to the parameter servers (the wire codec)
  static constexpr const char* name = "per_path";
};

/// The codec of each path for a trainer's Compressor parameter.
template <class C>
struct path_compressors {
  using dense = C;
  using push = C;
  static constexpr bool split = false;
};
template <class Dense, class Push>
struct path_compressors<per_path<Dense, Push>> {
  using dense = Dense;
  using push = Push;
  static constexpr bool split = true;
};

/// What a trainer accepts as its Compressor: one `compressor` for every path, or `per_path`.
template <class C>
concept trainer_compressor = compressor<C> || path_compressors<C>::split;

}  // namespace strata::compress

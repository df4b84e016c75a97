/// @file concepts.hpp
/// The `ctr_model` contract: a click-through-rate model's dense part, fed with embedding rows
/// looked up elsewhere (local tables, a hash table, parameter servers).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/embedding/concepts.hpp"

namespace strata::models {

/// One batch as a CTR model sees it.
struct ctr_inputs {
  /// batch × dense_features() numeric features.
  matrix_view<const float> dense;
  /// embedded[t]: batch × tables()[t].dim, the (pooled) row of table t for each sample.
  std::span<const matrix_view<const float>> embedded;
};

/// A CTR model: dense parameters in one flat buffer, embedding rows as inputs.
///
/// - `m.tables()` → `std::vector<embedding::table_spec>`: the embedding tables the model reads,
///   in input order (names, rows, dims). Fixed at construction.
/// - `m.dense_features()` → number of dense input columns.
/// - `m.sparse_features()` → number of sparse (categorical) input columns the model reads, and
///   `m.input_column(t)` → the sparse column whose keys table t looks up (< sparse_features();
///   several tables may read one column, as Wide & Deep's wide and deep table of a feature do).
///   The trainer reads the keys of table t from that column and never guesses from internals.
/// - `m.parameters()`, `m.gradients()` → `std::span<float>`: every dense parameter, and its
///   gradient, in one flat contiguous buffer each (same size, same order), so an allreduce or
///   broadcast is one call. Spans stay valid for the model's lifetime.
/// - `m.forward(in, logits)`: logits[i] = the model's logit for sample i (`logits.size()` =
///   batch). Any batch size; internal buffers are reused. Keeps views of `in` (and what
///   backward needs): the caller keeps the inputs alive until backward.
/// - `m.backward(dlogits, embedded_grads)`: from dL/dlogits of the last forward, overwrites
///   gradients() with dL/dparams and writes embedded_grads[t] (batch × tables()[t].dim) =
///   dL/d(embedded[t]). Deterministic: bitwise identical results whatever the thread count.
/// - Wrong shapes (dense columns, number of tables, rows/dims of a table's batch, logits size,
///   backward before forward) raise `strata::error` (`errc::size_mismatch` or
///   `errc::invalid_argument`) naming the table or input.
/// - Optional: `m.zero_initialised(t)` → bool: table t starts at zero instead of the trainer's
///   random initialisation (Wide & Deep's wide tables: a linear model's weights).
/// - A model is not thread-safe; its calls use oneTBB internally.
template <class M>
concept ctr_model = requires(M& m, const M& cm, const ctr_inputs& in, std::span<float> logits,
                             std::span<const float> dlogits,
                             std::span<const matrix_view<float>> embedded_grads) {
  { cm.tables() } -> std::convertible_to<std::vector<embedding::table_spec>>;
  { cm.dense_features() } -> std::convertible_to<std::size_t>;
  { cm.sparse_features() } -> std::convertible_to<std::size_t>;
  { cm.input_column(std::size_t{}) } -> std::convertible_to<std::size_t>;
  { m.parameters() } -> std::same_as<std::span<float>>;
  { m.gradients() } -> std::same_as<std::span<float>>;
  m.forward(in, logits);
  m.backward(dlogits, embedded_grads);
};

namespace detail {

/// Throws `errc::size_mismatch` unless `in` fits `tables` and `dense_features`.
inline void check_inputs(std::string_view model, const std::vector<embedding::table_spec>& tables,
                         std::size_t dense_features, const ctr_inputs& in) {
  const std::size_t batch = in.dense.rows();
  if (in.dense.cols() != dense_features)
    fail(errc::size_mismatch, cat(model, "::forward: dense input has ", in.dense.cols(),
                                  " features per sample but the model expects ", dense_features));
  if (in.embedded.size() != tables.size())
    fail(errc::size_mismatch,
         cat(model, "::forward: got ", in.embedded.size(), " embedding inputs but the model reads ",
             tables.size(), " tables (one batch x dim view per table)"));
  for (std::size_t t = 0; t < tables.size(); ++t) {
    const auto& e = in.embedded[t];
    if (e.rows() != batch || e.cols() != tables[t].dim)
      fail(errc::size_mismatch,
           cat(model, "::forward: embedding input of table ", t, " '", tables[t].name, "' is ",
               e.rows(), " x ", e.cols(), " but must be ", batch, " x ", tables[t].dim,
               " (batch x dim; the batch is the dense input's rows)"));
  }
}

/// Throws `errc::size_mismatch` unless `grads` fits `tables` for `batch` samples.
inline void check_embedding_grads(std::string_view model,
                                  const std::vector<embedding::table_spec>& tables,
                                  std::size_t batch, std::span<const matrix_view<float>> grads) {
  if (grads.size() != tables.size())
    fail(errc::size_mismatch,
         cat(model, "::backward: got ", grads.size(),
             " embedding gradient views but the model reads ", tables.size(), " tables"));
  for (std::size_t t = 0; t < tables.size(); ++t)
    if (grads[t].rows() != batch || grads[t].cols() != tables[t].dim)
      fail(errc::size_mismatch, cat(model, "::backward: gradient view of table ", t, " '",
                                    tables[t].name, "' is ", grads[t].rows(), " x ",
                                    grads[t].cols(), " but must be ", batch, " x ", tables[t].dim));
}

/// Row counts of `count` tables from a config: one entry per table, or one for all.
inline std::vector<std::uint64_t> table_rows(std::string_view model,
                                             const std::vector<std::uint64_t>& rows,
                                             std::size_t count) {
  if (rows.size() == count) return rows;
  if (rows.size() == 1) return std::vector<std::uint64_t>(count, rows.front());
  fail(errc::size_mismatch, cat(model, "::config: table_rows has ", rows.size(), " entries for ",
                                count, " sparse features; give one per feature or one for all"));
}

}  // namespace detail

}  // namespace strata::models

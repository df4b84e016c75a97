/// @file onnx.hpp
/// ONNX export of a bundle's whole predictor: one graph from hashed keys and dense features to
/// the click probability, for onnxruntime, Triton's ONNX backend or any ONNX runtime.
///
/// ```cpp
/// strata::serve::export_onnx("bundle", "model.onnx");  // + model.table-000.f32 … beside it
/// ```
///
/// Needs the CMake target strata::onnx (Debian's libonnx-dev and libprotobuf-dev: ONNX's own
/// protobuf classes and checker). A program built without it still compiles; its calls raise
/// errc::unsupported naming the packages. The core library stays header-only and ONNX-free.
#pragma once

#include <algorithm>
#include <bit>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include "strata/core/error.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
#include "strata/nn/parameters.hpp"
#include "strata/serve/bundle.hpp"
#include "strata/serve/predictor.hpp"

#ifdef STRATA_HAS_ONNX
// ONNX's parser header (which the checker and shape inference include) has an enumerator
// MAP_TYPE, a macro of <sys/mman.h> (the predictor's mmap): hidden while ONNX's headers read.
#pragma push_macro("MAP_TYPE")
#undef MAP_TYPE
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>
#pragma pop_macro("MAP_TYPE")
#endif

namespace strata::serve {

/// How an ONNX model is written.
struct onnx_options {
  /// Replace an existing model file and its data files (otherwise refused).
  bool overwrite = false;
  /// When exporting from a bundle directory: check every bundle file's checksum on open
  /// (predictor_options::verify_checksums).
  bool verify_checksums = true;
};

/// What an ONNX export wrote.
struct onnx_report {
  std::filesystem::path model;                    ///< the .onnx file
  std::vector<std::filesystem::path> data_files;  ///< one per table, beside the model
  std::uint64_t model_bytes = 0;                  ///< the .onnx file: graph and dense parameters
  std::uint64_t data_bytes = 0;                   ///< the data files together (fp32 tables)
  std::size_t nodes = 0;                          ///< nodes of the graph
};

/// The graph's names and versions (the same for every model kind).
struct onnx_graph_spec {
  /// float [batch, dense_features]: the transformed dense features, as predictor::predict.
  static constexpr std::string_view dense_input = "dense";
  /// int64 [batch, sparse_features]: hashed keys, as predictor::predict (key of column c in
  /// [0, hash.rows[c])).
  static constexpr std::string_view sparse_input = "sparse";
  /// float [batch, 1]: the click probability sigmoid(logit).
  static constexpr std::string_view output = "probability";
  /// The symbolic batch dimension of the inputs and the output.
  static constexpr std::string_view batch_dim = "batch";
  /// Operator set 13 of the default domain and IR version 7 (ONNX 1.8): every op used is in
  /// it, and onnxruntime ≥ 1.6 and Triton's ONNX backend load it.
  static constexpr std::int64_t opset = 13;
  static constexpr std::int64_t ir_version = 7;
};

/// The data file of table `t` beside the model file `model`: "<model stem>.table-NNN.f32"
/// (fp32 rows, row-major, little-endian: ONNX external data of initializer "table_NNN").
inline std::filesystem::path onnx_table_file(const std::filesystem::path& model, std::size_t t) {
  return model.parent_path() / cat(model.stem().string(), ".table-",
                                   t < 10    ? "00"
                                   : t < 100 ? "0"
                                             : "",
                                   t, ".f32");
}

namespace detail {

/// Checks the output path before anything is written: `model` names a file (not a directory)
/// and, without `overwrite`, neither it nor a data file of its `tables` tables exists.
inline void check_onnx_target(const std::filesystem::path& model, std::size_t tables,
                              bool overwrite) {
  namespace fs = std::filesystem;
  if (model.empty() || !model.has_filename() || model.filename() == "." || model.filename() == "..")
    fail(errc::invalid_argument,
         cat("ONNX export: '", model.string(), "' does not name a file; give e.g. model.onnx"));
  std::error_code ec;
  if (fs::is_directory(model, ec))
    fail(errc::invalid_argument,
         cat("ONNX export: ", model.string(), " is a directory; give the model's file name, e.g. ",
             (model / "model.onnx").string()));
  if (overwrite) return;
  for (std::size_t t = 0; t <= tables; ++t) {
    const auto path = t < tables ? onnx_table_file(model, t) : model;
    if (fs::exists(path, ec))
      fail(errc::invalid_argument,
           cat("ONNX export: ", path.string(),
               " already exists; choose another model name, remove it, or overwrite it "
               "(onnx_options::overwrite, strata_export --overwrite)"));
  }
}

/// The error of a build without ONNX.
[[noreturn]] inline void onnx_unavailable(const char* who) {
  fail(errc::unsupported,
       cat(who,
           ": this program was built without ONNX export; install ONNX and protobuf (Debian: "
           "apt-get install libonnx-dev libprotobuf-dev), configure strata again (it finds them "
           "with STRATA_ONNX=AUTO, the default) and link the CMake target strata::onnx"));
}

}  // namespace detail

#ifdef STRATA_HAS_ONNX
namespace detail {

/// A node attribute: an integer or a list of integers.
struct onnx_attribute {
  std::string name;
  std::vector<std::int64_t> values;
  bool list = false;
};
inline onnx_attribute int_attribute(std::string name, std::int64_t v) {
  return {std::move(name), {v}, false};
}
inline onnx_attribute ints_attribute(std::string name, std::vector<std::int64_t> v) {
  return {std::move(name), std::move(v), true};
}

/// Builds an ONNX graph: nodes with generated output names, initializers inline (raw data)
/// or as external data, and the typed graph inputs and outputs.
class onnx_graph_builder {
 public:
  explicit onnx_graph_builder(onnx::GraphProto& graph) : graph_(graph) {}

  /// Adds a node `op(inputs)` with one output, named `output` or generated from `op`; returns
  /// the output's name.
  std::string node(std::string_view op, std::initializer_list<std::string> inputs,
                   std::vector<onnx_attribute> attributes = {}, std::string output = {}) {
    return node(op, std::vector<std::string>(inputs), std::move(attributes), std::move(output));
  }
  std::string node(std::string_view op, const std::vector<std::string>& inputs,
                   std::vector<onnx_attribute> attributes = {}, std::string output = {}) {
    if (output.empty()) output = cat(op, "_", graph_.node_size());
    auto* n = graph_.add_node();
    n->set_op_type(std::string(op));
    n->set_name(cat(op, "_", graph_.node_size() - 1));
    for (const auto& in : inputs)
      n->add_input(in);
    n->add_output(output);
    for (const auto& a : attributes) {
      auto* attr = n->add_attribute();
      attr->set_name(a.name);
      if (a.list) {
        attr->set_type(onnx::AttributeProto::INTS);
        for (const auto v : a.values)
          attr->add_ints(v);
      } else {
        attr->set_type(onnx::AttributeProto::INT);
        attr->set_i(a.values.at(0));
      }
    }
    return output;
  }

  /// An int64 initializer of shape `dims` (empty: a scalar).
  std::string int64s(const std::string& name, const std::vector<std::int64_t>& dims,
                     const std::vector<std::int64_t>& values) {
    auto* t = tensor(name, onnx::TensorProto::INT64, dims);
    for (const auto v : values)
      t->add_int64_data(v);
    return name;
  }

  /// An fp32 initializer of shape `dims` holding `values` inline (little-endian raw data).
  std::string floats(const std::string& name, const std::vector<std::int64_t>& dims,
                     std::span<const float> values) {
    auto* t = tensor(name, onnx::TensorProto::FLOAT, dims);
    t->set_raw_data(values.data(), values.size_bytes());
    return name;
  }

  /// An fp32 initializer of shape `dims` whose values are the file `location` (relative to the
  /// model's directory), `bytes` long: ONNX external data.
  std::string external_floats(const std::string& name, const std::vector<std::int64_t>& dims,
                              const std::string& location, std::uint64_t bytes) {
    auto* t = tensor(name, onnx::TensorProto::FLOAT, dims);
    t->set_data_location(onnx::TensorProto::EXTERNAL);
    for (const auto& [key, value] : {std::pair<std::string, std::string>("location", location),
                                     {"offset", "0"},
                                     {"length", std::to_string(bytes)}}) {
      auto* entry = t->add_external_data();
      entry->set_key(key);
      entry->set_value(value);
    }
    return name;
  }

  /// A graph input or output of element type `type` and shape [batch, dims…].
  void input(std::string_view name, int type, std::vector<std::int64_t> dims) {
    value(graph_.add_input(), name, type, dims);
  }
  void output(std::string_view name, int type, std::vector<std::int64_t> dims) {
    value(graph_.add_output(), name, type, dims);
  }

 private:
  onnx::TensorProto* tensor(const std::string& name, int type,
                            const std::vector<std::int64_t>& dims) {
    auto* t = graph_.add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    for (const auto d : dims)
      t->add_dims(d);
    return t;
  }
  static void value(onnx::ValueInfoProto* v, std::string_view name, int type,
                    const std::vector<std::int64_t>& dims) {
    v->set_name(std::string(name));
    auto* tensor = v->mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(type);
    auto* shape = tensor->mutable_shape();
    shape->add_dim()->set_dim_param(std::string(onnx_graph_spec::batch_dim));
    for (const auto d : dims)
      shape->add_dim()->set_dim_value(d);
  }

  onnx::GraphProto& graph_;
};

inline std::int64_t as_dim(std::uint64_t v) {
  if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
    fail(errc::unsupported, cat("ONNX export: size ", v, " does not fit an ONNX dimension"));
  return static_cast<std::int64_t>(v);
}

/// The values of the model's dense block `name` (errc::internal if the model has none of
/// `size` values: the graph and the model disagree, a strata bug).
inline std::span<const float> block(const nn::parameter_set& blocks, std::span<const float> dense,
                                    const std::string& name, std::size_t size) {
  for (const auto& b : blocks.blocks())
    if (b.name == name) {
      if (b.size != size || b.offset + size > dense.size()) break;
      return dense.subspan(b.offset, size);
    }
  fail(errc::internal, cat("ONNX export: the model has no dense block '", name, "' of ", size,
                           " values; a strata bug, please report it"));
}

/// An MLP as Gemm (y = x·Wᵀ + b: W is out × in, as nn::linear stores it) per layer, Relu
/// between layers and after the last when `relu_last`, as nn::mlp. Returns the output name.
inline std::string mlp(onnx_graph_builder& g, std::string x, const std::string& name,
                       std::size_t in, const std::vector<std::size_t>& sizes, bool relu_last,
                       const nn::parameter_set& blocks, std::span<const float> dense) {
  for (std::size_t l = 0; l < sizes.size(); ++l) {
    const std::size_t out = sizes[l];
    const auto layer = cat(name, ".", l);
    const auto w = g.floats(layer + ".weight", {as_dim(out), as_dim(in)},
                            block(blocks, dense, layer + ".weight", out * in));
    const auto b =
        g.floats(layer + ".bias", {as_dim(out)}, block(blocks, dense, layer + ".bias", out));
    x = g.node("Gemm", {x, w, b}, {int_attribute("transB", 1)});
    if (l + 1 < sizes.size() || relu_last) x = g.node("Relu", {x});
    in = out;
  }
  return x;
}

/// DLRM's logit from the rows `rows[t]` ([batch, d] each):
/// z = bottom MLP; T = Reshape(Concat(z, e_0 … e_{F−1}), [batch, F+1, d]);
/// dots = MatMul(T, Transpose(T)); x = Concat(z, Gather(Reshape(dots, [batch, (F+1)²]),
/// the strictly lower triangle row by row, as nn::interaction)); logit = top MLP(x).
inline std::string logit(onnx_graph_builder& g, const models::dlrm::config& c,
                         const std::string& dense_input, const std::vector<std::string>& rows,
                         const nn::parameter_set& blocks, std::span<const float> dense) {
  const auto z = mlp(g, dense_input, "bottom", c.dense_features, c.bottom_mlp, true, blocks, dense);
  const std::size_t n = c.sparse_features + 1, d = c.embedding_dim;
  std::vector<std::string> parts = {z};
  parts.insert(parts.end(), rows.begin(), rows.end());
  const auto stacked = g.node("Concat", parts, {int_attribute("axis", 1)});
  // Shape 0 copies the batch dimension (allowzero = 0): batches of 0 samples reshape too.
  const auto t =
      g.node("Reshape", {stacked, g.int64s("interaction.shape", {3}, {0, as_dim(n), as_dim(d)})});
  const auto tt = g.node("Transpose", {t}, {ints_attribute("perm", {0, 2, 1})});
  const auto dots = g.node("MatMul", {t, tt});
  const auto flat =
      g.node("Reshape", {dots, g.int64s("interaction.flat_shape", {2}, {0, as_dim(n * n)})});
  std::vector<std::int64_t> lower;  // (i, j), i in 1..F, j < i, as nn::interaction writes them
  for (std::size_t i = 1; i < n; ++i)
    for (std::size_t j = 0; j < i; ++j)
      lower.push_back(as_dim(i * n + j));
  const auto pairs = g.node(
      "Gather", {flat, g.int64s("interaction.lower_triangle", {as_dim(lower.size())}, lower)},
      {int_attribute("axis", 1)});
  const auto x = g.node("Concat", {z, pairs}, {int_attribute("axis", 1)});
  return mlp(g, x, "top", d + lower.size(), c.top_mlp, false, blocks, dense);
}

/// Wide & Deep's logit from the rows `rows[t]` (the F wide tables [batch, 1], then the F deep
/// ones [batch, d]): Sum(b_wide, w_0 … w_{F−1}) + deep MLP(Concat(dense, v_0 … v_{F−1})),
/// summed in models::wide_deep's order.
inline std::string logit(onnx_graph_builder& g, const models::wide_deep::config& c,
                         const std::string& dense_input, const std::vector<std::string>& rows,
                         const nn::parameter_set& blocks, std::span<const float> dense) {
  static_assert(models::wide_deep::wide_tables_first == 0,
                "the deep rows are taken as the tables after the wide ones");
  const std::size_t f_count = c.sparse_features;
  const auto first_wide = static_cast<std::ptrdiff_t>(models::wide_deep::wide_tables_first);
  std::vector<std::string> wide = {
      g.floats("wide.bias", {1}, block(blocks, dense, "wide.bias", 1))};
  wide.insert(wide.end(), rows.begin() + first_wide,
              rows.begin() + first_wide + static_cast<std::ptrdiff_t>(f_count));
  const auto wide_sum = g.node("Sum", wide);
  std::vector<std::string> parts = {dense_input};
  parts.insert(parts.end(), rows.begin() + static_cast<std::ptrdiff_t>(f_count), rows.end());
  const auto x = g.node("Concat", parts, {int_attribute("axis", 1)});
  const auto deep =
      mlp(g, x, "deep", c.dense_features + f_count * c.deep_dim, c.deep_mlp, false, blocks, dense);
  return g.node("Add", {wide_sum, deep});
}

/// Writes table t of `p` as fp32 rows into `path` (decoding fp16 / int8 rows exactly as the
/// predictor does), through a writable mapping, in parallel over row blocks.
template <class Model>
void write_fp32_table(const predictor<Model>& p, std::size_t t, const std::filesystem::path& path) {
  const auto& e = p.manifest().tables[t];
  const auto rows = p.table_bytes(t);
  const precision from = p.manifest().rows_precision;
  writable_map file(path, static_cast<std::size_t>(e.rows * e.dim * sizeof(float)), "ONNX export");
  auto* out = reinterpret_cast<float*>(file.bytes().data());
  tbb::parallel_for(tbb::blocked_range<std::uint64_t>(0, e.rows, 4096), [&](const auto& range) {
    for (std::uint64_t r = range.begin(); r != range.end(); ++r)
      decode_row(from, rows.data() + r * e.row_bytes, std::span<float>(out + r * e.dim, e.dim));
  });
  file.sync();
}

/// Renames `from` to `to` (replacing it); errc::io_error naming both on failure.
inline void rename_file(const std::filesystem::path& from, const std::filesystem::path& to) {
  std::error_code ec;
  std::filesystem::rename(from, to, ec);
  if (ec)
    fail(errc::io_error, cat("ONNX export: cannot rename ", from.string(), " to ", to.string(),
                             ": ", ec.message()));
}

}  // namespace detail

// The public definitions below differ from a build without ONNX: an inline namespace of their
// own keeps a program that mixes both kinds of translation unit free of ODR clashes.
inline namespace with_onnx {

/// Whether this translation unit can export ONNX (it was built with strata::onnx).
inline constexpr bool onnx_available = true;

/// Writes the ONNX model `out` (and one data file per table beside it, onnx_table_file) that
/// computes what `p.predict` computes:
/// ```
/// inputs   dense  float [batch, D], sparse int64 [batch, F]      (onnx_graph_spec)
/// keys   = Where(sparse < 0, INT64_MAX, sparse)   // a negative key is refused like one ≥ rows
/// e_t    = Gather(table_t, Gather(keys, column(t), axis 1))      // [batch, dim_t]
/// logit  = the model's dense part (detail::logit: Gemm + Relu MLPs, DLRM's interaction as a
///          batched MatMul and a Gather of the lower triangle; Wide & Deep's Sum of the wide rows)
/// output probability = Sigmoid(logit)  float [batch, 1]
/// ```
/// Tables are initializers `table_NNN` [rows, dim] stored as ONNX external data (fp32, one file
/// each), so tables beyond protobuf's 2 GB limit export; fp16 and int8 bundles are dequantised
/// to fp32 exactly as the predictor decodes them. The dense parameters are stored inline.
/// The graph is checked by ONNX's checker (with its external data in place) and by its strict
/// shape inference before the model file appears: data files are written first, the model last
/// (staged as `out.tmp` and renamed). A key ≥ its table's rows is an out-of-bounds Gather index:
/// onnxruntime refuses the call, as the predictor raises errc::out_of_range.
///
/// Cost: one pass over every table (decode + write) plus the dense parameters. `p` is only read.
template <class Model>
onnx_report export_onnx(const predictor<Model>& p, const std::filesystem::path& out,
                        const onnx_options& options = {}) {
  namespace fs = std::filesystem;
  static_assert(std::endian::native == std::endian::little,
                "ONNX raw and external data are little-endian; so are strata's bundles");
  const auto& m = p.manifest();
  detail::check_onnx_target(out, m.tables.size(), options.overwrite);
  std::error_code ec;
  if (!out.parent_path().empty()) fs::create_directories(out.parent_path(), ec);
  if (ec)
    fail(errc::io_error, cat("ONNX export: cannot create ", out.parent_path().string(), " (",
                             ec.message(), "); choose a directory you can write"));

  onnx::ModelProto model;
  model.set_ir_version(onnx_graph_spec::ir_version);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(onnx_graph_spec::opset);
  model.set_producer_name("strata");
  model.set_producer_version(cat("bundle format ", bundle_version));
  model.set_doc_string(cat(
      "strata ", m.model, " click model (bundle step ", m.step, ", ", to_string(m.rows_precision),
      " rows exported as fp32). Inputs: '", onnx_graph_spec::dense_input, "' float [batch, ",
      p.dense_features(), "] transformed dense features; '", onnx_graph_spec::sparse_input,
      "' int64 [batch, ", p.sparse_features(),
      m.vocabulary_file.empty() ? "] hashed keys (column c in [0, hash_rows[c]))"
                                : "] table rows: hashed keys (column c in [0, hash_rows[c])) "
                                  "mapped through the bundle's vocabulary",
      ". Output: '", onnx_graph_spec::output, "' float [batch, 1]."));
  const auto meta = [&](const std::string& key, const std::string& value) {
    auto* entry = model.add_metadata_props();
    entry->set_key("strata." + key);
    entry->set_value(value);
  };
  const auto joined = [](const std::vector<std::uint64_t>& values) {
    std::string s;
    for (const auto v : values)
      s += cat(s.empty() ? "" : " ", v);
    return s;
  };
  meta("model", m.model);
  meta("step", std::to_string(m.step));
  meta("bundle_precision", std::string(to_string(m.rows_precision)));
  meta("bundle_fingerprint", bundle_manifest::hex(m.fingerprint));
  meta("hash_seed", std::to_string(m.hash_seed));
  meta("hash_rows", joined(m.hash_rows));
  meta("missing_keys", joined(m.missing_keys));
  if (!m.vocabulary_file.empty())  // hashed keys → rows (data::ctr_vocabulary::map)
    meta("vocabulary", cat(m.vocabulary_file, " (frequency thresholding: the bundle's ",
                           "file; map hashed keys through it before the graph)"));

  auto* graph = model.mutable_graph();
  graph->set_name(cat("strata_", m.model));
  detail::onnx_graph_builder g(*graph);
  const std::string dense_input(onnx_graph_spec::dense_input);
  const std::string sparse_input(onnx_graph_spec::sparse_input);
  g.input(dense_input, onnx::TensorProto::FLOAT, {detail::as_dim(p.dense_features())});
  g.input(sparse_input, onnx::TensorProto::INT64, {detail::as_dim(p.sparse_features())});

  // Keys: a negative int64 is a uint64 key ≥ 2^63, which the predictor refuses: map it to an
  // index Gather refuses too (ONNX's Gather would count a negative index from the end).
  const auto negative = g.node("Less", {sparse_input, g.int64s("key.zero", {}, {0})});
  const auto keys =
      g.node("Where",
             {negative, g.int64s("key.refused", {}, {std::numeric_limits<std::int64_t>::max()}),
              sparse_input},
             {}, "keys");
  std::vector<std::string> column_keys(p.sparse_features());
  for (std::size_t c = 0; c < column_keys.size(); ++c)
    column_keys[c] =
        g.node("Gather", {keys, g.int64s(cat("key.column_", c), {}, {detail::as_dim(c)})},
               {detail::int_attribute("axis", 1)}, cat("keys_", c));

  // Tables: external data files, written (staged) before the model.
  onnx_report report;
  std::vector<std::string> rows;
  std::vector<fs::path> staged;
  const auto remove_staged = [&] {
    for (const auto& path : staged)
      fs::remove(path, ec);
  };
  try {
    for (std::size_t t = 0; t < m.tables.size(); ++t) {
      const auto& e = m.tables[t];
      const auto path = onnx_table_file(out, t);
      const std::uint64_t bytes = e.rows * e.dim * sizeof(float);
      const auto name = cat("table_", t < 10 ? "00" : t < 100 ? "0" : "", t);
      const auto table = g.external_floats(name, {detail::as_dim(e.rows), detail::as_dim(e.dim)},
                                           path.filename().string(), bytes);
      rows.push_back(g.node("Gather", {table, column_keys.at(e.column)}, {}, cat("rows_", t)));
      staged.push_back(path.string() + ".tmp");
      detail::write_fp32_table(p, t, staged.back());
      report.data_files.push_back(path);
      report.data_bytes += bytes;
    }
  } catch (...) {
    remove_staged();
    throw;
  }

  const typename Model::config config = p.model_config();
  const Model probe(config);
  const auto logit =
      detail::logit(g, config, dense_input, rows, probe.parameter_blocks(), p.dense_parameters());
  g.node("Sigmoid", {logit}, {}, std::string(onnx_graph_spec::output));
  g.output(onnx_graph_spec::output, onnx::TensorProto::FLOAT, {1});
  report.nodes = static_cast<std::size_t>(graph->node_size());

  const auto model_bytes = model.ByteSizeLong();
  if (model_bytes > static_cast<std::size_t>(INT_MAX)) {
    remove_staged();
    fail(errc::unsupported,
         cat("ONNX export: the graph with its dense parameters takes ", model_bytes,
             " bytes, beyond protobuf's 2 GB message limit (only the tables are external data)"));
  }
  // The graph must type-check: strict shape inference (it also records the intermediate
  // shapes in the model, for viewers and runtimes).
  try {
    onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(),
                                       onnx::ShapeInferenceOptions(true, 1, false));
  } catch (const std::exception& e) {
    remove_staged();
    fail(errc::internal, cat("ONNX export: ONNX's shape inference refused the graph of ", m.model,
                             " (", e.what(), "); a strata bug, please report it"));
  }

  for (std::size_t t = 0; t < staged.size(); ++t)
    detail::rename_file(staged[t], report.data_files[t]);
  const fs::path staged_model = out.string() + ".tmp";
  {
    std::ofstream file(staged_model, std::ios::binary | std::ios::trunc);
    if (!file || !model.SerializeToOstream(&file) || !file.flush())
      fail(errc::io_error,
           cat("ONNX export: cannot write ", staged_model.string(), "; is the disk full?"));
  }
  // ONNX's checker, reading the file as a runtime would: it also checks that every external
  // data file is in place beside it.
  try {
    onnx::checker::check_model(staged_model.string());
  } catch (const std::exception& e) {
    fs::remove(staged_model, ec);
    fail(errc::internal, cat("ONNX export: ONNX's checker refused the model (", e.what(),
                             "); a strata bug, please report it"));
  }
  detail::rename_file(staged_model, out);
  report.model = out;
  report.model_bytes = fs::file_size(out);
  return report;
}

/// Exports bundle directory `bundle` (a DLRM or Wide & Deep) as the ONNX model `out`: opens
/// it as predictor<Model> with all its checks, then export_onnx above.
inline onnx_report export_onnx(const std::filesystem::path& bundle,
                               const std::filesystem::path& out, const onnx_options& options = {}) {
  const auto kind = bundle_manifest::read(bundle).model;
  const predictor_options open{.verify_checksums = options.verify_checksums};
  if (kind == model_traits<models::dlrm>::kind)
    return export_onnx(predictor<models::dlrm>(bundle, open), out, options);
  if (kind == model_traits<models::wide_deep>::kind)
    return export_onnx(predictor<models::wide_deep>(bundle, open), out, options);
  fail(errc::unsupported, cat("ONNX export: bundle ", bundle.string(), " holds a '", kind,
                              "' model; ONNX export knows dlrm and wide_deep"));
}

}  // namespace with_onnx
#else
inline namespace without_onnx {

/// Whether this translation unit can export ONNX (it was built with strata::onnx).
inline constexpr bool onnx_available = false;

/// This build has no ONNX: raises errc::unsupported naming the packages to install.
template <class Model>
onnx_report export_onnx(const predictor<Model>&, const std::filesystem::path&,
                        const onnx_options& = {}) {
  detail::onnx_unavailable("serve::export_onnx");
}

/// This build has no ONNX: raises errc::unsupported naming the packages to install.
[[noreturn]] inline onnx_report export_onnx(const std::filesystem::path&,
                                            const std::filesystem::path&,
                                            const onnx_options& = {}) {
  detail::onnx_unavailable("serve::export_onnx");
}

}  // namespace without_onnx
#endif

}  // namespace strata::serve

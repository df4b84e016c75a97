// serve::export_onnx: a small DLRM and Wide & Deep (tests/support/serve_fixtures.hpp) trained,
// bundled (fp32, int8, fp16) and exported as ONNX. ONNX's checker accepts each model read back
// from its file; the graph has the documented inputs, output and shapes (strict shape inference
// agrees); every table is external data whose file holds exactly the predictor's decoded rows;
// DLRM's interaction gathers strata's lower triangle; bad targets are refused with a sentence.
// (Numerical parity with the predictor through onnxruntime: tests/serve/onnx_parity.py.)
// Built without strata::onnx, the cases report SKIP.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "strata/serve.hpp"
#include "strata/serve/onnx.hpp"
#include "support/catch_error.hpp"
#include "support/serve_fixtures.hpp"
#include "support/skip.hpp"
#include "support/temp_dir.hpp"

using namespace strata;
using strata_test::catch_error;
using strata_test::contains;
using strata_test::temp_dir;
using namespace strata_test::serving;
namespace fs = std::filesystem;

namespace {

constexpr const char* no_onnx =
    "this build has no ONNX export (Debian: apt-get install libonnx-dev libprotobuf-dev, then "
    "configure again); tests/serve/onnx_unavailable.cpp checks the error it raises";

const trained_bundles& shared_bundles() {
  static const trained_bundles b;
  return b;
}

#ifdef STRATA_HAS_ONNX
std::vector<char> file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

onnx::ModelProto load(const fs::path& path) {
  onnx::ModelProto m;
  std::ifstream in(path, std::ios::binary);
  REQUIRE(m.ParseFromIstream(&in));
  return m;
}

/// "batch" or the value of each dimension of a graph input or output.
std::vector<std::string> dims(const onnx::ValueInfoProto& v) {
  std::vector<std::string> out;
  for (const auto& d : v.type().tensor_type().shape().dim())
    out.push_back(d.has_dim_param() ? d.dim_param() : std::to_string(d.dim_value()));
  return out;
}

const onnx::TensorProto& initializer(const onnx::ModelProto& m, const std::string& name) {
  for (const auto& t : m.graph().initializer())
    if (t.name() == name) return t;
  FAIL("no initializer " << name);
  return m.graph().initializer(0);
}

std::map<std::string, std::string> external_data(const onnx::TensorProto& t) {
  std::map<std::string, std::string> out;
  for (const auto& e : t.external_data())
    out[e.key()] = e.value();
  return out;
}

std::map<std::string, int> op_counts(const onnx::ModelProto& m) {
  std::map<std::string, int> out;
  for (const auto& n : m.graph().node())
    ++out[n.op_type()];
  return out;
}

/// The checks every exported model passes, for a bundle opened as predictor<Model>.
template <class Model>
void check_export(const fs::path& bundle, const fs::path& out) {
  const serve::predictor<Model> p(bundle);
  const auto& manifest = p.manifest();
  const auto report = serve::export_onnx(p, out);
  CHECK(report.model == out);
  CHECK(report.model_bytes == fs::file_size(out));
  REQUIRE(report.data_files.size() == manifest.tables.size());

  // ONNX's checker, on the file (it needs the external data in place), passes.
  CHECK_NOTHROW(onnx::checker::check_model(out.string()));
  auto m = load(out);
  CHECK(m.ir_version() == serve::onnx_graph_spec::ir_version);
  REQUIRE(m.opset_import_size() == 1);
  CHECK(m.opset_import(0).version() == serve::onnx_graph_spec::opset);

  // Inputs and output, with the dynamic batch dimension.
  const auto& g = m.graph();
  REQUIRE(g.input_size() == 2);
  CHECK(g.input(0).name() == "dense");
  CHECK(g.input(0).type().tensor_type().elem_type() == onnx::TensorProto::FLOAT);
  CHECK(dims(g.input(0)) == std::vector<std::string>{"batch", "13"});
  CHECK(g.input(1).name() == "sparse");
  CHECK(g.input(1).type().tensor_type().elem_type() == onnx::TensorProto::INT64);
  CHECK(dims(g.input(1)) == std::vector<std::string>{"batch", "26"});
  REQUIRE(g.output_size() == 1);
  CHECK(g.output(0).name() == "probability");
  CHECK(g.output(0).type().tensor_type().elem_type() == onnx::TensorProto::FLOAT);
  CHECK(dims(g.output(0)) == std::vector<std::string>{"batch", "1"});
  CHECK(g.node(g.node_size() - 1).op_type() == "Sigmoid");

  // Strict shape inference over the whole graph finds the output [batch, 1] again: with the
  // declared output shape removed, inference must put it back.
  auto stripped = m;
  stripped.mutable_graph()->clear_value_info();
  stripped.mutable_graph()->mutable_output(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  CHECK_NOTHROW(onnx::shape_inference::InferShapes(stripped, onnx::OpSchemaRegistry::Instance(),
                                                   onnx::ShapeInferenceOptions(true, 1, false)));
  CHECK(dims(stripped.graph().output(0)) == std::vector<std::string>{"batch", "1"});

  // Every table: an external-data initializer [rows, dim] whose file beside the model holds
  // the predictor's decoded rows (fp32, little-endian), byte for byte.
  for (std::size_t t = 0; t < manifest.tables.size(); ++t) {
    const auto& e = manifest.tables[t];
    INFO("table " << t << " '" << e.name << "'");
    const auto name = cat("table_", t < 10 ? "00" : "0", t);
    const auto& tensor = initializer(m, name);
    CHECK(tensor.data_type() == onnx::TensorProto::FLOAT);
    CHECK(tensor.data_location() == onnx::TensorProto::EXTERNAL);
    REQUIRE(tensor.dims_size() == 2);
    CHECK(tensor.dims(0) == static_cast<std::int64_t>(e.rows));
    CHECK(tensor.dims(1) == static_cast<std::int64_t>(e.dim));
    const std::uint64_t bytes = e.rows * e.dim * 4;
    const auto file =
        out.parent_path() / cat(out.stem().string(), ".table-0", t < 10 ? "0" : "", t, ".f32");
    CHECK(report.data_files[t] == file);
    CHECK(external_data(tensor) ==
          std::map<std::string, std::string>{{"location", file.filename().string()},
                                             {"offset", "0"},
                                             {"length", std::to_string(bytes)}});
    REQUIRE(fs::exists(file));
    CHECK(fs::file_size(file) == bytes);
    std::vector<float> decoded(e.rows * e.dim);
    for (std::uint64_t r = 0; r < e.rows; ++r)
      serve::decode_row(manifest.rows_precision, p.table_bytes(t).data() + r * e.row_bytes,
                        std::span<float>(decoded.data() + r * e.dim, e.dim));
    const auto written = file_bytes(file);
    REQUIRE(written.size() == bytes);
    CHECK(std::memcmp(written.data(), decoded.data(), bytes) == 0);
    // The keys of the table's input column feed its Gather.
    bool gathered = false;
    for (const auto& n : g.node())
      if (n.op_type() == "Gather" && n.input(0) == name)
        gathered = n.input(1) == cat("keys_", e.column);
    CHECK(gathered);
    CHECK_FALSE(fs::exists(file.string() + ".tmp"));
  }
  CHECK_FALSE(fs::exists(out.string() + ".tmp"));
  std::uint64_t data_bytes = 0;
  for (const auto& f : report.data_files)
    data_bytes += fs::file_size(f);
  CHECK(report.data_bytes == data_bytes);
  CHECK(report.nodes == static_cast<std::size_t>(g.node_size()));

  // The bundle's hashing spec travels as metadata (a client hashes raw features with it).
  std::map<std::string, std::string> meta;
  for (const auto& e : m.metadata_props())
    meta[e.key()] = e.value();
  CHECK(meta["strata.model"] == manifest.model);
  CHECK(meta["strata.hash_seed"] == std::to_string(manifest.hash_seed));
  CHECK(meta["strata.bundle_fingerprint"] == serve::bundle_manifest::hex(manifest.fingerprint));
  CHECK(meta["strata.bundle_precision"] == std::string(serve::to_string(manifest.rows_precision)));
  CHECK(meta["strata.hash_rows"].find(std::to_string(table_rows)) == 0);

  // The dense parameters are inline and are the bundle's: the first layer's weight.
  const auto first_layer = manifest.model == "dlrm" ? "bottom.0.weight" : "deep.0.weight";
  const auto& w = initializer(m, first_layer);
  CHECK(w.data_location() == onnx::TensorProto::DEFAULT);
  const Model probe(p.model_config());
  for (const auto& b : probe.parameter_blocks().blocks())
    if (b.name == first_layer) {
      REQUIRE(w.raw_data().size() == b.size * 4);
      CHECK(std::memcmp(w.raw_data().data(), p.dense_parameters().data() + b.offset, b.size * 4) ==
            0);
    }
}
#endif

}  // namespace

TEST_CASE("DLRM bundles export as a checked ONNX graph with external tables", "[serve][onnx]") {
  if constexpr (!serve::onnx_available) {
    strata_test::skip(no_onnx);
    return;
  }
#ifdef STRATA_HAS_ONNX
  const auto& b = shared_bundles();
  temp_dir work("onnx_dlrm");
  for (const auto& bundle : {b.dlrm_fp32, b.dlrm_int8}) {
    INFO("bundle " << bundle.filename().string());
    const auto out = work.path / bundle.filename() / "dlrm.onnx";
    check_export<models::dlrm>(bundle, out);
    const auto m = load(out);
    // Gemm per linear layer (bottom 13-8-4, top 355-8-1) with ReLU after every bottom layer
    // and between the top ones; the interaction as one batched MatMul; 26 column gathers, 26
    // table gathers and the lower triangle.
    auto ops = op_counts(m);
    CHECK(ops["Gemm"] == 4);
    CHECK(ops["Relu"] == 3);
    CHECK(ops["MatMul"] == 1);
    CHECK(ops["Transpose"] == 1);
    CHECK(ops["Gather"] == 26 + 26 + 1);
    CHECK(ops["Sigmoid"] == 1);
    // The pairs in nn::interaction's order: (i, j) for i = 1..26, j < i, of the 27 × 27 dots.
    const auto& lower = initializer(m, "interaction.lower_triangle");
    REQUIRE(lower.int64_data_size() == 27 * 26 / 2);
    int k = 0;
    for (int i = 1; i < 27; ++i)
      for (int j = 0; j < i; ++j)
        CHECK(lower.int64_data(k++) == i * 27 + j);
  }
#endif
}

TEST_CASE("Wide & Deep bundles export as a checked ONNX graph with external tables",
          "[serve][onnx]") {
  if constexpr (!serve::onnx_available) {
    strata_test::skip(no_onnx);
    return;
  }
#ifdef STRATA_HAS_ONNX
  const auto& b = shared_bundles();
  temp_dir work("onnx_wd");
  for (const auto& bundle : {b.wide_deep_fp32, b.wide_deep_fp16}) {
    INFO("bundle " << bundle.filename().string());
    const auto out = work.path / bundle.filename() / "wide_deep.onnx";
    check_export<models::wide_deep>(bundle, out);
    const auto m = load(out);
    auto ops = op_counts(m);
    CHECK(ops["Gemm"] == 2);
    CHECK(ops["Relu"] == 1);
    CHECK(ops["Sum"] == 1);  // b_wide + the 26 wide rows
    CHECK(ops["Gather"] == 26 + 52);
    CHECK(ops["MatMul"] == 0);
    for (const auto& n : m.graph().node())
      if (n.op_type() == "Sum") {
        REQUIRE(n.input_size() == 27);
        CHECK(n.input(0) == "wide.bias");
        CHECK(n.input(1) == "rows_0");
        CHECK(n.input(26) == "rows_25");
      }
  }
#endif
}

TEST_CASE("the ONNX export refuses what it cannot write, with a sentence", "[serve][onnx]") {
  if constexpr (!serve::onnx_available) {
    strata_test::skip(no_onnx);
    return;
  }
  const auto& b = shared_bundles();
  temp_dir work("onnx_errors");
  const auto out = work.path / "m.onnx";
  const auto report = serve::export_onnx(b.dlrm_fp32, out);  // from the directory
  CHECK(report.data_files.size() == 26);

  SECTION("an existing model or data file without overwrite") {
    auto e = catch_error([&] { serve::export_onnx(b.dlrm_fp32, out); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "table-000.f32 already exists"));
    CHECK(contains(e.what(), "overwrite"));
    fs::remove(out.parent_path() / "m.table-000.f32");
    fs::remove(out.parent_path() / "m.table-001.f32");
    e = catch_error([&] { serve::export_onnx(b.dlrm_fp32, out); });
    CHECK(contains(e.what(), "m.table-002.f32 already exists"));
    for (std::size_t t = 2; t < 26; ++t)
      fs::remove(serve::onnx_table_file(out, t));
    e = catch_error([&] { serve::export_onnx(b.dlrm_fp32, out); });
    CHECK(contains(e.what(), "m.onnx already exists"));
    // With overwrite: written again (another model kind into the same name).
    const auto again = serve::export_onnx(b.wide_deep_fp32, out, {.overwrite = true});
    CHECK(again.data_files.size() == 52);
    CHECK(fs::file_size(again.data_files[0]) == table_rows * 4);
  }
  SECTION("a directory or no file name") {
    auto e = catch_error([&] { serve::export_onnx(b.dlrm_fp32, work.path); });
    CHECK(e.code() == errc::invalid_argument);
    CHECK(contains(e.what(), "is a directory"));
    e = catch_error([&] { serve::export_onnx(b.dlrm_fp32, fs::path("")); });
    CHECK(contains(e.what(), "does not name a file"));
  }
  SECTION("a missing or damaged bundle") {
    auto e = catch_error([&] { serve::export_onnx(work.path / "nothing", work.path / "x.onnx"); });
    CHECK(e.code() == errc::io_error);
    CHECK(contains(e.what(), "is this an inference bundle?"));
    const auto damaged = work.path / "damaged";
    fs::copy(b.wide_deep_fp16, damaged, fs::copy_options::recursive);
    {
      std::fstream f(damaged / "table-030.fp16", std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(5);
      f.put('\x5a');
    }
    e = catch_error([&] { serve::export_onnx(damaged, work.path / "x.onnx"); });
    CHECK(e.code() == errc::corrupt_data);
    CHECK(contains(e.what(), "table-030.fp16 does not match its checksum"));
    CHECK_FALSE(fs::exists(work.path / "x.onnx"));
    // Without the checksum pass it exports (what the damaged file holds).
    CHECK_NOTHROW(serve::export_onnx(damaged, work.path / "x.onnx", {.verify_checksums = false}));
  }
}

// serve_onnx_parity_data WORK_DIR: the C++ half of the ONNX parity test (onnx_parity.sh runs
// it, then onnx_parity.py compares onnxruntime with it). Trains the small DLRM and Wide & Deep
// of tests/support/serve_fixtures.hpp, bundles them (DLRM fp32 and int8, Wide & Deep fp32 and
// fp16), exports each bundle as WORK_DIR/<bundle>/model.onnx, and for batches of 1 and 512
// held-out samples writes the inputs and serve::predictor's probabilities:
//   <bundle>-b<B>.dense.f32   float32 [B, 13]     <bundle>-b<B>.sparse.i64  int64 [B, 26]
//   <bundle>-b<B>.expected.f32  float32 [B]       (little-endian, row-major)
// and one line per case in WORK_DIR/cases.txt:
//   <bundle> <model.onnx> <B> <dense file> <sparse file> <expected file> <rows of table 0>
// Exit 0 when written, 77 (skip) when this build has no ONNX export, 1 on an error.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "strata/serve.hpp"
#include "strata/serve/onnx.hpp"
#include "support/serve_fixtures.hpp"

namespace {

using namespace strata;
namespace fs = std::filesystem;

template <class T>
void write(const fs::path& path, const std::vector<T>& values) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(T)));
  if (!out.flush()) fail(errc::io_error, cat("cannot write ", path.string()));
}

template <class Model>
void write_cases(const fs::path& bundle, const fs::path& work, std::ofstream& cases) {
  const auto& d = strata_test::serving::shared_data();
  const serve::predictor<Model> p(bundle);
  const auto name = bundle.filename().string();
  const auto model = work / name / "model.onnx";
  const auto report = serve::export_onnx(p, model, {.overwrite = true});
  std::printf("%s: %s (%zu nodes, %llu bytes) + %zu table files (%llu bytes)\n", name.c_str(),
              model.string().c_str(), report.nodes,
              static_cast<unsigned long long>(report.model_bytes), report.data_files.size(),
              static_cast<unsigned long long>(report.data_bytes));
  for (const std::size_t batch : {std::size_t{1}, std::size_t{512}}) {
    std::vector<std::size_t> idx(batch);
    std::iota(idx.begin(), idx.end(), batch == 1 ? std::size_t{777} : std::size_t{0});
    const auto b = d.eval.gather(idx);
    std::vector<float> dense(b.dense.view().data(), b.dense.view().data() + batch * 13);
    std::vector<std::int64_t> keys(batch * 26);
    for (std::size_t i = 0; i < batch; ++i)
      for (std::size_t c = 0; c < 26; ++c)
        keys[i * 26 + c] = static_cast<std::int64_t>(b.keys(i, c));
    std::vector<float> expected(batch);
    p.predict(b.dense.view(), b.keys.view(), expected);
    const auto stem = work / cat(name, "-b", batch);
    write(stem.string() + ".dense.f32", dense);
    write(stem.string() + ".sparse.i64", keys);
    write(stem.string() + ".expected.f32", expected);
    cases << name << ' ' << model.string() << ' ' << batch << ' ' << stem.string() << ".dense.f32 "
          << stem.string() << ".sparse.i64 " << stem.string() << ".expected.f32 "
          << p.manifest().tables[0].rows << '\n';
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: serve_onnx_parity_data WORK_DIR\n");
    return 1;
  }
  if constexpr (!serve::onnx_available) {
    std::printf(
        "SKIP: this build has no ONNX export (Debian: apt-get install libonnx-dev "
        "libprotobuf-dev, then configure strata again)\n");
    return 77;
  }
  try {
    const fs::path work = argv[1];
    fs::create_directories(work);
    const strata_test::serving::trained_bundles bundles;
    std::ofstream cases(work / "cases.txt", std::ios::trunc);
    write_cases<models::dlrm>(bundles.dlrm_fp32, work, cases);
    write_cases<models::dlrm>(bundles.dlrm_int8, work, cases);
    write_cases<models::wide_deep>(bundles.wide_deep_fp32, work, cases);
    write_cases<models::wide_deep>(bundles.wide_deep_fp16, work, cases);
    if (!cases.flush()) fail(errc::io_error, cat("cannot write ", (work / "cases.txt").string()));
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve_onnx_parity_data: %s\n", e.what());
    return 1;
  }
}

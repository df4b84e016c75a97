// serve::export_onnx in a program built without strata::onnx (this file is compiled without it
// in every build, tests/CMakeLists.txt): both calls raise errc::unsupported naming the Debian
// packages and the CMake target, before touching the bundle or the output path.
#include <catch2/catch.hpp>

#include <filesystem>

#include "strata/serve/onnx.hpp"
#include "support/catch_error.hpp"
#include "support/temp_dir.hpp"

using namespace strata;
using strata_test::catch_error;
using strata_test::contains;

static_assert(!serve::onnx_available, "this test must be built without strata::onnx");

TEST_CASE("without ONNX the export names the packages to install", "[serve][onnx]") {
  strata_test::temp_dir work("onnx_unavailable");
  const auto check = [&](const strata::error& e) {
    CHECK(e.code() == errc::unsupported);
    CHECK(contains(e.what(), "serve::export_onnx: this program was built without ONNX export"));
    CHECK(contains(e.what(), "apt-get install libonnx-dev libprotobuf-dev"));
    CHECK(contains(e.what(), "strata::onnx"));
  };
  check(catch_error([&] { serve::export_onnx(work.path / "no-bundle", work.path / "m.onnx"); }));
  CHECK_FALSE(std::filesystem::exists(work.path / "m.onnx"));
  using export_from_predictor = decltype(serve::export_onnx(
      std::declval<const serve::predictor<models::dlrm>&>(), std::filesystem::path()));
  static_assert(std::is_same_v<export_from_predictor, serve::onnx_report>);
}

// Uses an installed strata::onnx: the ONNX export is available, and refuses a missing bundle
// with strata's error (nothing is written).
#include <cstdio>
#include <filesystem>

#include "strata/serve/onnx.hpp"

static_assert(strata::serve::onnx_available, "strata::onnx must define STRATA_HAS_ONNX");

int main() {
  const auto dir = std::filesystem::temp_directory_path() / "strata-onnx-consumer";
  try {
    strata::serve::export_onnx(dir / "no-bundle", dir / "m.onnx");
  } catch (const strata::error& e) {
    if (e.code() == strata::errc::io_error && !std::filesystem::exists(dir / "m.onnx")) {
      std::printf("strata_onnx_consumer: ONNX export linked (a missing bundle is refused)\n");
      return 0;
    }
    std::fprintf(stderr, "strata_onnx_consumer: unexpected error: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "strata_onnx_consumer: a missing bundle was exported\n");
  return 1;
}

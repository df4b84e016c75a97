#!/usr/bin/env bash
# Installs what strata needs (Debian 12), configures, builds and runs every test.
# Usage: scripts/test.sh [build-dir [cmake-args...]]   (default: build). Exit code = test result.
# Extra CMake arguments (after the build folder) are passed to the configure step as given.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath -m "${1:-"$root/build"}")  # absolute: the consumer check below configures elsewhere
shift $(($# > 0 ? 1 : 0))
# shellcheck source=scripts/common.sh
source "$root/scripts/common.sh"
strata_install_packages dataset-fashion-mnist libopenmpi-dev openmpi-bin

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build "$build" -j "$(strata_jobs)"
# Every public header compiles on its own (exists unless -DSTRATA_VERIFY_HEADERS=OFF).
if grep -q '^STRATA_VERIFY_HEADERS:BOOL=ON' "$build/CMakeCache.txt"; then
  cmake --build "$build" -j "$(strata_jobs)" --target strata_verify_interface_header_sets
fi
(cd "$build" && ctest --output-on-failure -j "$(strata_jobs)" --timeout 600)

# The installed package works from a separate project (find_package(strata)).
prefix="$build/install-check"
rm -rf "$prefix" "$build/consumer"
cmake --install "$build" --prefix "$prefix" >/dev/null
cmake -S "$root/tests/cmake" -B "$build/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$build/consumer" >/dev/null
"$build/consumer/strata_consumer"
if [ -x "$build/consumer/strata_onnx_consumer" ]; then "$build/consumer/strata_onnx_consumer"; fi
echo "strata: all tests passed"

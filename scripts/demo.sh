#!/usr/bin/env bash
# Installs what strata needs (Debian 12), builds, and trains the CTR example with its defaults
# (synthetic Criteo-format data, workers and parameter servers as threads in this process).
# Extra arguments go to the example: scripts/demo.sh --model wide_deep --strategy ps
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
# shellcheck source=scripts/common.sh
source "$root/scripts/common.sh"
strata_install_packages

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
if [ -f "$root/examples/ctr_train.cpp" ]; then
  cmake --build "$build" -j "$(strata_jobs)" --target ctr_train
  exec "$build/examples/ctr_train" "$@"
else
  cmake --build "$build" -j "$(strata_jobs)" --target allreduce_demo
  exec "$build/examples/allreduce_demo" "$@"
fi

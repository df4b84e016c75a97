#!/usr/bin/env bash
# The strategy guide's experiments (docs/strategy-guide.md): installs what is missing (Debian
# 12: the build's packages and python3-matplotlib), builds ctr_train as scripts/demo.sh does,
# then runs every experiment — one ctr_train process per configuration, ranks as threads with
# emulated links — writing CSV into docs/data/ and PNG plots into docs/img/.
#   scripts/experiments.sh                # all six experiments (about 12 minutes here)
#   scripts/experiments.sh --only 1,3     # some of them
#   scripts/experiments.sh --quick --data-dir /tmp/d --img-dir /tmp/i   # a smoke run
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build"
# shellcheck source=scripts/common.sh
source "$root/scripts/common.sh"
strata_install_packages python3-matplotlib

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(strata_jobs)" --target ctr_train
cd "$root"
exec /usr/bin/python3 "$root/scripts/experiments.py" --ctr-train "$build/examples/ctr_train" \
  --data-dir "$root/docs/data" --img-dir "$root/docs/img" "$@"

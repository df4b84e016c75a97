#!/usr/bin/env bash
# GPU check for strata's CUDA path (≤ ~8 minutes on one H200): configures with -DSTRATA_CUDA=ON,
# builds the CUDA tests and bench, runs them, and writes logs and JSON into OUTDIR.
# Usage: scripts/gpu-check.sh OUTDIR [CUDA_ARCHITECTURES (default 90)]
set -euo pipefail
out=${1:?usage: scripts/gpu-check.sh OUTDIR [CUDA_ARCHITECTURES]}
arch=${2:-90}
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-gpu-check"
mkdir -p "$out"
out=$(cd "$out" && pwd)
jobs=$(nproc 2>/dev/null || echo 4)
{
  nvidia-smi || echo "nvidia-smi not available"
  nvcc --version
} > "$out/device.txt" 2>&1
status=0
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DSTRATA_TEST_DIRS=cuda -DSTRATA_BUILD_BENCH=OFF \
  -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_VERIFY_HEADERS=OFF > "$out/configure.log" 2>&1
timeout 300 cmake --build "$build" --target cuda_test_kernels cuda_test_dense bench_cuda \
  -j"$jobs" > "$out/build.log" 2>&1 || { echo "build failed: see $out/build.log"; exit 1; }
for t in cuda_test_kernels cuda_test_dense; do
  if timeout 120 "$build/tests/cuda/$t" --reporter junit --out "$out/$t.xml" \
      > "$out/$t.log" 2>&1 && timeout 60 env STRATA_CUDA_SYNC=1 "$build/tests/cuda/$t" \
      > "$out/$t.sync.log" 2>&1; then
    echo "$t: passed"
  else
    echo "$t: FAILED (see $out/$t.log)"; status=1
  fi
done
if timeout 120 "$build/tests/cuda/bench_cuda" --json "$out/bench_cuda.json" > "$out/bench_cuda.log" 2>&1; then
  cat "$out/bench_cuda.log"
else
  echo "bench_cuda: FAILED (see $out/bench_cuda.log)"; status=1
fi
exit $status

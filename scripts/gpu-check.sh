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
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "WARNING: no GPU visible (nvidia-smi -L failed): the CUDA tests below only SKIP and the benches measure nothing"
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES="$arch" -DSTRATA_TEST_DIRS=cuda -DSTRATA_BUILD_BENCH=OFF \
  -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_VERIFY_HEADERS=OFF > "$out/configure.log" 2>&1 ||
  { echo "configure failed: see $out/configure.log"; exit 1; }
tests="cuda_test_kernels cuda_test_dense cuda_test_cache cuda_test_gpu_worker cuda_test_link"
# cuda_test_nccl exists only when CMake found NCCL.
# (grep without -q reads all of ninja's output: with pipefail, an early exit would SIGPIPE ninja.)
if ninja -C "$build" -t targets all 2>/dev/null | grep '^cuda_test_nccl:' > /dev/null; then
  tests="$tests cuda_test_nccl"
else
  echo "cuda_test_nccl: not built (CMake found no NCCL; see $out/configure.log)"
fi
timeout 300 cmake --build "$build" --target $tests bench_cuda bench_gpu_worker \
  -j"$jobs" > "$out/build.log" 2>&1 || { echo "build failed: see $out/build.log"; exit 1; }
for t in $tests; do
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
# The GPU worker: cuda::dlrm step and 1-worker trainer vs the CPU model; PyTorch on the same GPU
# when python3 has torch with CUDA (skipped otherwise).
if timeout 150 "$build/tests/cuda/bench_gpu_worker" --json "$out/bench_gpu_worker.json" \
    --peer "$root/bench/peers/dlrm_torch.py" > "$out/bench_gpu_worker.log" 2>&1; then
  cat "$out/bench_gpu_worker.log"
else
  echo "bench_gpu_worker: FAILED (see $out/bench_gpu_worker.log)"; status=1
fi
exit $status

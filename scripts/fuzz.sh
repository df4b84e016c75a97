#!/usr/bin/env bash
# Builds strata's libFuzzer targets (tests/fuzz: Criteo lines, IDX files, parameter-server
# messages, checkpoints, frequency-threshold vocabularies) with clang and runs each on a fresh
# copy of its seed corpus (one after the other, or --parallel N at a time). docs/fuzzing.md
# says what each target covers and what counts as a finding.
#
# Usage: scripts/fuzz.sh [--seconds N | --runs N] [--parallel N] [--build-only] [--target NAME]...
#                        [build-dir]
#   --seconds N   fuzz each target for N seconds (-max_total_time; default 60)
#   --runs N      fuzz each target for N executions instead (-runs)
#   --parallel N  run N targets at once (default 1; each target is one process on one core)
#   --build-only  build the targets and stop (a later run finds them built)
#   --target NAME only this target (criteo, idx, protocol, checkpoint, vocabulary); repeatable
#   build-dir     default: build-fuzz beside this script's folder
# Prints each target's executions and exec/s; exit code 1 on any finding (crash, sanitizer
# report, an escaping non-strata exception, a broken oracle, a timeout of 10 s or more than
# 2 GiB of memory on one input), with the input under BUILD/fuzz-work/TARGET/artifacts/.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build="$root/build-fuzz"
limit=(-max_total_time=60)
limit_text="60 s"
parallel=1
build_only=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) limit=("-max_total_time=$2"); limit_text="$2 s"; shift 2 ;;
    --runs) limit=("-runs=$2"); limit_text="$2 runs"; shift 2 ;;
    --target) targets+=("$2"); shift 2 ;;
    --build-only) build_only=1; shift ;;
    --parallel)
      [[ "$2" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz: --parallel takes a count >= 1, not '$2'" >&2; exit 2; }
      parallel=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "fuzz: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) build=$1; shift ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(criteo idx protocol checkpoint vocabulary)
for t in "${targets[@]}"; do
  [ -d "$root/tests/fuzz/corpus/$t" ] || { echo "fuzz: no target '$t' (criteo, idx, protocol, checkpoint, vocabulary)" >&2; exit 2; }
done
command -v clang++ >/dev/null || { echo "fuzz: clang++ not found (Debian: clang)" >&2; exit 2; }

start=$SECONDS
# Only the fuzz targets: no other tests (STRATA_TEST_DIRS=fuzz matches no test_*.cpp), no
# examples, benches, header checks, CUDA, oneDNN or BLAS (the readers use none of them).
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTRATA_FUZZ=ON -DSTRATA_TEST_DIRS=fuzz -DSTRATA_CUDA=OFF \
  -DSTRATA_BUILD_EXAMPLES=OFF -DSTRATA_BUILD_BENCH=OFF -DSTRATA_VERIFY_HEADERS=OFF \
  -DSTRATA_ONEDNN=OFF -DSTRATA_CBLAS=OFF >/dev/null
cmake --build "$build" -j "$(nproc 2>/dev/null || echo 2)" \
  --target "${targets[@]/#/fuzz_}"
if [ "$build_only" -eq 1 ]; then
  echo "fuzz: built ${targets[*]} in $((SECONDS - start)) s"
  exit 0
fi
echo "fuzz: built in $((SECONDS - start)) s; fuzzing each target for $limit_text"

# One target: fuzzes it, then writes its verdict (ok / interrupted / finding) and the report
# lines into its work folder, so that several can run at once and report in a fixed order.
fuzz_target() {
  local t=$1 work="$build/fuzz-work/$1" t0=$SECONDS rc=0 pid
  # One process per target (no -jobs/-workers): --parallel decides how many share the machine.
  "$build/tests/fuzz/fuzz_$t" "${limit[@]}" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1 &
  pid=$!
  wait "$pid" || rc=$?
  rm -rf "/dev/shm/strata-fuzz-$pid"  # the target's scratch folder, left behind by a finding
  local runs rate files
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/log" | tail -1)
  files=$(find "$work/corpus" -type f | wc -l)
  echo "fuzz: $t: ${runs:-?} executions in $((SECONDS - t0)) s (${rate:-?} exec/s), corpus $files inputs, exit $rc" \
    >"$work/report"
  if [ "$rc" -eq 72 ] && [ -z "$(ls -A "$work/artifacts")" ]; then
    # libFuzzer's exit code after SIGINT/SIGTERM: stopped from outside, not a finding, but the
    # run is incomplete.
    echo interrupted >"$work/verdict"
    echo "fuzz: $t: interrupted by a signal before its limit (no finding); log $work/log" >>"$work/report"
  elif [ "$rc" -ne 0 ] || [ -n "$(ls -A "$work/artifacts")" ]; then
    echo finding >"$work/verdict"
    {
      echo "fuzz: $t: FINDING; log $work/log, input(s):"
      ls -l "$work/artifacts"
      grep -E -A25 'ERROR: |runtime error|strata fuzz finding|terminate called|==[0-9]+==' \
        "$work/log" | head -60 || tail -40 "$work/log"
    } >>"$work/report"
  else
    echo ok >"$work/verdict"
  fi
}

running=0
for t in "${targets[@]}"; do
  work="$build/fuzz-work/$t"
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  cp "$root/tests/fuzz/corpus/$t/"* "$work/corpus/"
  if [ "$running" -ge "$parallel" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  fuzz_target "$t" &
  running=$((running + 1))
done
wait || true

failed=()
for t in "${targets[@]}"; do
  work="$build/fuzz-work/$t"
  verdict=$(cat "$work/verdict" 2>/dev/null || echo "no verdict")
  if [ "$verdict" = ok ]; then
    cat "$work/report"
  else
    cat "$work/report" >&2 2>/dev/null || echo "fuzz: $t: no report (the runner died)" >&2
    if [ "$verdict" = interrupted ]; then failed+=("$t(interrupted)"); else failed+=("$t"); fi
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: findings or incomplete runs in ${failed[*]} after $((SECONDS - start)) s" >&2
  exit 1
fi
echo "fuzz: no findings in ${targets[*]} after $((SECONDS - start)) s"

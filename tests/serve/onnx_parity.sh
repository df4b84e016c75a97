#!/usr/bin/env bash
# The ONNX parity test (ctest serve_onnx_parity):
#   onnx_parity.sh DATA_PROGRAM WORK_DIR VENV_DIR
# 1. bench/peers/ort_venv.sh VENV_DIR: onnxruntime from PyPI; when it cannot be installed (no
#    network), exit 77 — ctest reports SKIP, never a pass;
# 2. DATA_PROGRAM WORK_DIR (serve_onnx_parity_data): bundles, ONNX models, inputs and the
#    predictor's outputs (77 when the build has no ONNX export: SKIP);
# 3. onnx_parity.py WORK_DIR/cases.txt: onnxruntime's outputs against the predictor's.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[ $# -eq 3 ] || { echo "usage: onnx_parity.sh DATA_PROGRAM WORK_DIR VENV_DIR" >&2; exit 2; }
program=$1 work=$2 venv=$3

if ! python=$("$here/../../bench/peers/ort_venv.sh" "$venv" | tail -n 1) || [ ! -x "$python" ]; then
    echo "SKIP: onnxruntime is not available (bench/peers/ort_venv.sh $venv failed, see above);" \
         "the parity of ONNX and the predictor was not checked"
    exit 77
fi
rm -rf "$work"
"$program" "$work"
rc=$?
[ $rc -eq 0 ] || exit $rc  # 77: no ONNX export in this build (SKIP), else a failure
exec "$python" "$here/onnx_parity.py" "$work/cases.txt"

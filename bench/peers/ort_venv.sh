#!/usr/bin/env bash
# Usage: bench/peers/ort_venv.sh [DIR]          (DIR default: <repo>/build/ort-venv)
#
# The Python environment that runs strata's exported ONNX models in onnxruntime: the ONNX parity
# test (tests/serve/onnx_parity.sh) and bench_serve's peer (bench/peers/serve_ort.py).
# Idempotent: creates or completes a virtual environment in DIR with onnxruntime==$ORT_VERSION
# (and the numpy it requires) from PyPI, checks that it imports with its CPU provider, and
# prints the venv's python as the last line of stdout. Everything else goes to stderr; when the
# environment cannot be made (no network, no python3-venv) it says why and exits 1 — the parity
# test then reports SKIP. A second run with everything in place only re-checks (about a second).
#
# Environment: PYTHON = the interpreter that creates the venv (default /usr/bin/python3, else
# python3; it must be able to run "-m venv", i.e. Debian's python3-venv).
set -euo pipefail

ORT_VERSION=1.32.0

die() { echo "ort_venv.sh: error: $*" >&2; exit 1; }
say() { echo "ort_venv.sh: $*" >&2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=${1:-$root/build/ort-venv}
mkdir -p "$dir" || die "cannot create $dir"
dir=$(cd "$dir" && pwd)

if [ -n "${PYTHON:-}" ]; then base_python=$PYTHON
elif [ -x /usr/bin/python3 ]; then base_python=/usr/bin/python3
else base_python=python3
fi

# One installer at a time per DIR.
if command -v flock >/dev/null 2>&1; then
    exec 9>"$dir/.venv.lock"
    flock 9
fi

py=$dir/bin/python
if [ ! -x "$py" ]; then
    say "creating the virtual environment in $dir with $base_python"
    "$base_python" -m venv "$dir" >&2 \
        || die "'$base_python -m venv $dir' failed (Debian: apt-get install python3-venv)"
fi
[ -x "$py" ] || die "$py missing after creating the venv"

have=$("$py" -c 'import importlib.metadata as m; print(m.version("onnxruntime"))' 2>/dev/null || echo -)
if [ "$have" != "$ORT_VERSION" ]; then
    say "installing onnxruntime==$ORT_VERSION (and numpy) from PyPI"
    "$py" -m pip --disable-pip-version-check --no-input install --retries 1 --timeout 30 \
        "onnxruntime==$ORT_VERSION" >&2 \
        || die "pip install onnxruntime==$ORT_VERSION failed (no network, or no such release on the index?)"
fi

# Check: it imports and has its CPU provider.
if ! check=$("$py" - <<'PY' 2>&1
import numpy as np
import onnxruntime as ort
from onnxruntime import __version__ as v
assert "CPUExecutionProvider" in ort.get_available_providers()
print(f"onnxruntime {v}, numpy {np.__version__}")
PY
); then
    echo "$check" >&2
    die "the check of $py failed (see above)"
fi
say "$check"
echo "$py"

#!/usr/bin/env bash
# Usage: bench/peers/venv.sh [DIR]          (DIR default: <repo>/build/peers-venv)
#
# The Python environment of strata's FBGEMM peers (bench/peers/dlrm_ctr_torch.py --embedding tbe,
# bench/peers/embedding_tbe.py). Idempotent: creates or completes a virtual environment in DIR with
#   torch==2.14.1, fbgemm-gpu-cpu==1.9.0 and numpy, from PyPI only
# (the pairing fbgemm_gpu 1.9 declares: its _fbgemm_torch_compat_table maps 1.9 -> torch 2.14),
# writes DIR/bin/peer-python (the interpreter to run the peers with), checks that torch and
# fbgemm_gpu import and that FBGEMM's CPU TBE ops work, and prints peer-python's absolute path as
# the last line of stdout. Everything else goes to stderr; on failure it says why and exits 1.
# A second run with everything in place only re-checks (a few seconds).
#
# Environment: PYTHON = the interpreter that creates the venv (default /usr/bin/python3, else
# python3; it must be able to run "-m venv", i.e. Debian's python3-venv).
#
# Why not a plain "pip install torch fbgemm-gpu-cpu": PyPI's Linux torch wheel is the CUDA build
# (CPU-only wheels live on PyTorch's own index, which is not reachable here). Its dependencies are
# ~4 GB of cuda-toolkit / nvidia-* wheels (cuBLAS, cuDNN, NCCL, ...), and even its libtorch_cpu.so
# links libcudart.so.13 and libcupti.so.13, so "pip install --no-deps torch" alone does not import.
# Instead, torch is installed with --no-deps plus its pure-Python requirements, and every NVIDIA
# library that the loaded torch / fbgemm_gpu libraries list as NEEDED (libcudart, libcublas(Lt),
# libcudnn, libcufft, libcufile, libcupti, libcurand, libcusparse(Lt), libnccl, libnvrtc,
# libnvshmem_host) is replaced by a stub generated here from the wheel's own undefined symbols
# (same symbol versions, every function returns an error: cudaGetDeviceCount says "no device")
# and built with the system cc into DIR/lib. The stubs are used even where a CUDA toolkit is
# installed system-wide, so the environment is the same on every machine. The CPU paths the peers
# use never call into them; torch.cuda.is_available() is False. Not installed either: triton
# (torch.compile's GPU code generator; unused on CPU). DIR/lib also holds libnvidia-ml.so.1, built
# from bench/peers/nvml_stub.c (see why there).
set -euo pipefail

TORCH_VERSION=2.14.1
FBGEMM_VERSION=1.9.0
# torch 2.14.1's Requires-Dist without the CUDA packages and triton; numpy for the peers (and
# fbgemm-gpu-cpu's only requirement).
TORCH_PY_DEPS=(filelock "typing-extensions>=4.10.0" "setuptools>=77.0.3" "sympy>=1.13.3"
               "networkx>=2.5.1" jinja2 "fsspec>=0.8.5" numpy)

die() { echo "venv.sh: error: $*" >&2; exit 1; }
say() { echo "venv.sh: $*" >&2; }

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=${1:-$root/build/peers-venv}
mkdir -p "$dir" || die "cannot create $dir"
dir=$(cd "$dir" && pwd)

if [ -n "${PYTHON:-}" ]; then base_python=$PYTHON
elif [ -x /usr/bin/python3 ]; then base_python=/usr/bin/python3
else base_python=python3
fi
for tool in cc readelf ldconfig; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (Debian: apt-get install gcc binutils)"
done

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

installed_versions() {
    "$py" - <<'PY' 2>/dev/null || true
import importlib.metadata as m
def v(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "-"
print(v("torch"), v("fbgemm-gpu-cpu"), v("numpy"), v("sympy"), v("setuptools"))
PY
}

read -r have_torch have_fbgemm have_numpy have_sympy have_setuptools <<<"$(installed_versions)"
if [ "${have_torch:-}" != "$TORCH_VERSION" ] || [ "${have_fbgemm:-}" != "$FBGEMM_VERSION" ] \
    || [ "${have_numpy:--}" = - ] || [ "${have_sympy:--}" = - ]; then
    pip=("$py" -m pip --disable-pip-version-check --no-input)
    say "installing torch==$TORCH_VERSION (--no-deps, ~550 MB), fbgemm-gpu-cpu==$FBGEMM_VERSION and numpy from PyPI"
    "${pip[@]}" install "${TORCH_PY_DEPS[@]}" >&2 || die "pip install of torch's Python requirements failed"
    "${pip[@]}" install --no-deps "torch==$TORCH_VERSION" "fbgemm-gpu-cpu==$FBGEMM_VERSION" >&2 \
        || die "pip install --no-deps torch==$TORCH_VERSION fbgemm-gpu-cpu==$FBGEMM_VERSION failed"
    read -r have_torch have_fbgemm have_numpy have_sympy have_setuptools <<<"$(installed_versions)"
    [ "$have_torch" = "$TORCH_VERSION" ] && [ "$have_fbgemm" = "$FBGEMM_VERSION" ] \
        || die "after pip install: torch $have_torch, fbgemm-gpu-cpu $have_fbgemm (wanted $TORCH_VERSION, $FBGEMM_VERSION)"
fi

site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
lib=$dir/lib
stub_build=$dir/build/nvidia-stubs
mkdir -p "$lib" "$stub_build"

# --- NVIDIA library stubs (see the header) ---
stamp="torch=$have_torch fbgemm=$have_fbgemm venv.sh=$(cksum <"${BASH_SOURCE[0]}" | cut -d' ' -f1)"
stub_ok=false
if [ -f "$stub_build/stamp" ] && [ "$(cat "$stub_build/stamp")" = "$stamp" ]; then
    stub_ok=true
    while read -r soname; do
        [ -f "$lib/$soname" ] || stub_ok=false
    done <"$stub_build/sonames"
fi
if ! $stub_ok; then
    say "generating stubs for the NVIDIA libraries torch $have_torch links"
    rm -f "$stub_build/stamp"
    "$py" - "$site" "$stub_build" <<'PY' || die "generating the NVIDIA library stubs failed"
import glob, os, re, subprocess, sys

site, out = sys.argv[1], sys.argv[2]
NVIDIA = re.compile(r"^lib(cu|nv|nccl)")  # CUDA runtime and math libraries, cuDNN, NCCL, NVSHMEM


def run(*cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def needed(path):
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run("readelf", "-dW", path))


SYM = re.compile(r"^\s*\d+:\s+[0-9a-fA-F]+\s+\S+\s+(\w+)\s+(\w+)\s+\w+\s+(\S+)\s+(\S+)")


def dynsyms(path):
    for line in run("readelf", "-W", "--dyn-syms", path).splitlines():
        m = SYM.match(line)
        if m:
            typ, bind, ndx, name = m.groups()
            name, _, ver = name.partition("@")
            yield typ, bind, ndx, name, ver.lstrip("@")


flag = {"x86_64": "x86-64", "aarch64": "AArch64"}.get(os.uname().machine)
system = {}
for line in run("ldconfig", "-p").splitlines():
    m = re.match(r"\s*(\S+) \(([^)]*)\) => (\S+)", line)
    if m and (flag is None or flag in m.group(2)):
        system.setdefault(m.group(1), m.group(3))
internal = {}
for pkg in ("torch", "fbgemm_gpu"):
    for p in sorted(glob.glob(os.path.join(site, pkg, "**", "*.so*"), recursive=True)):
        internal.setdefault(os.path.basename(p), p)

# Everything `import torch, fbgemm_gpu` loads: torch._C and fbgemm_gpu's libraries, their NEEDED
# closure inside the wheels and the system (the NVIDIA libraries excepted: those get stubs).
queue = glob.glob(os.path.join(site, "torch", "_C*.so")) + \
    glob.glob(os.path.join(site, "fbgemm_gpu", "*.so"))
if not queue:
    sys.exit(f"no torch/_C*.so under {site}")
seen, stubbed, unresolved = set(), set(), set()
while queue:
    p = queue.pop()
    if p in seen:
        continue
    seen.add(p)
    for soname in needed(p):
        if soname in internal:
            queue.append(internal[soname])
        elif NVIDIA.match(soname):
            stubbed.add(soname)
        elif soname in system:
            queue.append(system[soname])
        else:
            unresolved.add(soname)
if unresolved:
    sys.exit("libraries found neither in the wheels nor on the system: " + " ".join(sorted(unresolved)))

defined, undefined = set(), {}
for p in seen:
    for typ, bind, ndx, name, ver in dynsyms(p):
        if not name:
            continue
        if ndx != "UND":
            defined.add(name)
        elif bind == "GLOBAL" and not re.match(r"_?Py", name):  # Py*: the interpreter's
            undefined[name] = (typ, ver)
stubs = sorted((name, typ, ver) for name, (typ, ver) in undefined.items() if name not in defined)

MSG = "NVIDIA library stubbed by strata's bench/peers/venv.sh (CPU-only environment)"
STRING = re.compile(r"^(cuda|cudnn|cusparse|cublas|cublasLt|cufft|curand|nvrtc|nccl)"
                    r"Get(Error|Status)(String|Name)$|^ncclGetLastError$")
ZERO_VERSION = {"cudnnGetVersion", "cudnnGetCudartVersion", "cublasLtGetVersion"}  # size_t f(void)
OUT_ZERO = {"cudaGetDeviceCount", "cudaDriverGetVersion", "cudaRuntimeGetVersion"}  # err f(int*)
c = ["/* Generated by bench/peers/venv.sh from the undefined symbols of torch's libraries. */",
     f'static const char msg[] = "{MSG}";']
versions = {}
for i, (name, typ, ver) in enumerate(stubs):
    label = f'__asm__("{name}")'
    if typ == "OBJECT":
        c.append(f"char s{i}[256] {label};")
    elif STRING.match(name):
        c.append(f"const char *s{i}(void) {label};\nconst char *s{i}(void) {{ return msg; }}")
    elif name in ZERO_VERSION:
        c.append(f"long s{i}(void) {label};\nlong s{i}(void) {{ return 0; }}")
    elif name in OUT_ZERO:  # 0 devices / no driver, and cudaErrorNoDevice
        c.append(f"int s{i}(int *p) {label};\nint s{i}(int *p) {{ if (p) *p = 0; return 100; }}")
    else:  # cudaErrorNoDevice for the CUDA runtime, CUDNN_STATUS_NOT_INITIALIZED, else "1"
        rc = 1001 if name.startswith("cudnn") else 100 if name.startswith("cuda") else 1
        c.append(f"int s{i}(void) {label};\nint s{i}(void) {{ return {rc}; }}")
    if ver:
        versions.setdefault(ver, []).append(name)
with open(os.path.join(out, "stub.c"), "w") as f:
    f.write("\n".join(c) + "\n")
with open(os.path.join(out, "stub.map"), "w") as f:
    for ver, names in sorted(versions.items()):
        f.write(f"{ver} {{\n  global:\n" + "".join(f"    {n};\n" for n in names) + "};\n")
with open(os.path.join(out, "sonames"), "w") as f:
    f.write("".join(s + "\n" for s in sorted(stubbed)))
print(f"venv.sh: {len(stubs)} stub symbols for {' '.join(sorted(stubbed))}", file=sys.stderr)
PY
    cc -c -fPIC -O0 -w -fno-builtin -o "$stub_build/stub.o" "$stub_build/stub.c" \
        || die "compiling $stub_build/stub.c failed"
    while read -r soname; do
        cc -shared -o "$lib/$soname.tmp" "$stub_build/stub.o" -Wl,-soname,"$soname" \
            -Wl,--version-script="$stub_build/stub.map" || die "linking the $soname stub failed"
        mv -f "$lib/$soname.tmp" "$lib/$soname"
    done <"$stub_build/sonames"
    echo "$stamp" >"$stub_build/stamp"
fi

# --- NVML stub (bench/peers/nvml_stub.c) ---
nvml=$lib/libnvidia-ml.so.1
if [ ! -f "$nvml" ] || [ "$here/nvml_stub.c" -nt "$nvml" ]; then
    cc -shared -fPIC -O2 -Wall -o "$nvml.tmp" "$here/nvml_stub.c" -Wl,-soname,libnvidia-ml.so.1 \
        || die "compiling $here/nvml_stub.c failed"
    mv -f "$nvml.tmp" "$nvml"
fi

# --- the wrapper: DIR/lib first on LD_LIBRARY_PATH, then the venv's python ---
wrapper=$dir/bin/peer-python
cat >"$wrapper.tmp" <<'SH'
#!/bin/sh
# Written by strata's bench/peers/venv.sh: the venv's python with the NVIDIA library stubs of
# ../lib on LD_LIBRARY_PATH (CPU-only torch from PyPI's CUDA wheel, fbgemm_gpu CPU).
venv=$(cd "$(dirname "$0")/.." && pwd) || exit 1
LD_LIBRARY_PATH="$venv/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
exec "$venv/bin/python" "$@"
SH
chmod +x "$wrapper.tmp"
if cmp -s "$wrapper.tmp" "$wrapper"; then rm -f "$wrapper.tmp"; else mv -f "$wrapper.tmp" "$wrapper"; fi

# --- check: imports, the TBE ops, one CPU TBE forward/backward with each optimizer we use ---
if ! check=$("$wrapper" - <<'PY' 2>&1
import warnings
warnings.filterwarnings("error", message=".*nvml")  # "Can't initialize NVML": a broken stub
import torch
import fbgemm_gpu
from fbgemm_gpu.split_embedding_configs import EmbOptimType as OptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen)

assert not torch.cuda.is_available() and torch.cuda.device_count() == 0
for op in ("split_embedding_codegen_lookup_sgd_function_pt2",
           "split_embedding_codegen_lookup_adagrad_function_pt2"):
    getattr(torch.ops.fbgemm, op)  # AttributeError if not registered
for opt in (OptimType.EXACT_SGD, OptimType.EXACT_ADAGRAD):
    tbe = SplitTableBatchedEmbeddingBagsCodegen(
        [(100, 8, EmbeddingLocation.HOST, ComputeDevice.CPU)] * 2, optimizer=opt,
        learning_rate=0.1, eps=1e-10, pooling_mode=PoolingMode.SUM)
    before = tbe.split_embedding_weights()[0].clone()
    out = tbe(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 1, 2, 3, 4]))  # T=2 x B=2 bags
    assert out.shape == (2, 16), out.shape
    out.sum().backward()
    assert not torch.equal(before, tbe.split_embedding_weights()[0]), "no fused update"
print(f"torch {torch.__version__}, fbgemm_gpu {fbgemm_gpu.__version__} ({fbgemm_gpu.__variant__})")
PY
); then
    echo "$check" >&2
    die "the check of $wrapper failed (see above)"
fi
say "$check, numpy $have_numpy"
echo "$wrapper"

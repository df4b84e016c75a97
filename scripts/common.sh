# Shared by scripts/test.sh and scripts/demo.sh: installs the Debian packages strata needs.
# shellcheck shell=bash

# libonnx-dev + libprotobuf-dev: strata::onnx (ONNX export, serve/onnx.hpp); python3-venv: the
# onnxruntime environment of the ONNX parity test and bench_serve (bench/peers/ort_venv.sh).
strata_packages=(g++ cmake ninja-build libtbb-dev catch2 libeigen3-dev zlib1g-dev libdnnl-dev ocl-icd-opencl-dev libblas-dev libopenblas0-pthread
                 libonnx-dev libprotobuf-dev python3-venv)

strata_install_packages() {
  local missing=()
  for pkg in "${strata_packages[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "strata: installing missing packages: ${missing[*]}" >&2
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "strata: need root or sudo to install ${missing[*]}" >&2; return 1; }
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -q >/dev/null
  "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

strata_jobs() { nproc 2>/dev/null || echo 2; }

#!/usr/bin/env bash
# Installs what moeblaze needs (Debian/Ubuntu packages) when missing, then configures and
# builds into build/. The CUDA 13 toolkit (headers, NVRTC) must already be installed.
# Environment: MOEBLAZE_BUILD_DIR (default build), MOEBLAZE_JOBS (default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${MOEBLAZE_BUILD_DIR:-build}
JOBS=${MOEBLAZE_JOBS:-$(nproc)}

need=()
have_pkg() { dpkg -s "$1" >/dev/null 2>&1; }
for p in cmake g++ make libfmt-dev libcli11-dev doctest-dev libsqlite3-dev nlohmann-json3-dev; do
  have_pkg "$p" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

# pytest for the Python package's tests (PyPI).
if ! python3 -c "import pytest" >/dev/null 2>&1; then
  echo "setup: installing pytest"
  python3 -m pip install -q pytest
fi
# nvdisasm for bench/sass.py (SASS read without a GPU; CTest "sass"): the nvidia-cuda-nvdisasm
# package (PyPI), pinned.
if ! python3 -c 'import sys; sys.path.insert(0, "bench"); import sass; sass.nvdisasm_path()' >/dev/null 2>&1; then
  echo "setup: installing nvidia-cuda-nvdisasm 13.5.37"
  python3 -m pip install -q --no-deps "nvidia-cuda-nvdisasm==13.5.37"
fi
# CUTLASS's C++ headers (CuTe) for the kernel layer: the nvidia-cutlass package (PyPI), headers
# only (its Python dependencies are not needed). Pinned with the library
# (runtime/toolchain.hpp kCutlassVersion, pyproject.toml).
cutlass_version() {
  python3 - <<'PY' 2>/dev/null
import importlib.util, os, re
spec = importlib.util.find_spec("cutlass_library")
h = os.path.join(spec.submodule_search_locations[0], "source/include/cutlass/version.h")
v = dict(re.findall(r"#define CUTLASS_(MAJOR|MINOR|PATCH) (\d+)", open(h).read()))
print(f"{v['MAJOR']}.{v['MINOR']}.{v['PATCH']}")
PY
}
if [ "$(cutlass_version)" != 4.2.0 ]; then
  echo "setup: installing nvidia-cutlass 4.2.0.0 (headers)"
  python3 -m pip install -q --no-deps "nvidia-cutlass==4.2.0.0"
fi
# torch (used on the CPU here) and transformers for the CPU tests of the transformers experts
# backend (python/tests/test_hf.py): the versions of the GPU machine. PyPI's torch wheel is a
# few GB with its CUDA libraries (minutes); MOEBLAZE_SKIP_TORCH=1 leaves both out (those tests
# then report themselves skipped).
if [ "${MOEBLAZE_SKIP_TORCH:-0}" != 1 ] && ! python3 -c "import torch, transformers" >/dev/null 2>&1; then
  echo "setup: installing torch and transformers (PyPI)"
  python3 -m pip install -q "torch==2.11.0" "transformers==5.17.0"
fi

# torchtitan and megatron-core for the CPU tests of moeblaze.torchtitan and moeblaze.megatron
# (python/tests/test_torchtitan.py, test_megatron.py). Without their declared dependencies
# (datasets, wandb, tokenizers, ...: not imported by the modules the tests use, and pip could
# replace the installed torch); torchtitan's pinned spmd_types and tyro are what it imports.
if [ "${MOEBLAZE_SKIP_TORCH:-0}" != 1 ] && ! python3 -c "import torchtitan.models.common.moe, megatron.core" >/dev/null 2>&1; then
  echo "setup: installing torchtitan 0.3.0 and megatron-core 0.16.1 (PyPI, without their dependencies)"
  python3 -m pip install -q --no-deps "torchtitan==0.3.0" "spmd_types==0.2.3" "megatron-core==0.16.1"
  python3 -m pip install -q "tyro==1.0.17"
fi

CUDA_ROOT=${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}
if [ ! -f "$CUDA_ROOT/include/cuda_bf16.h" ]; then
  echo "setup: the CUDA 13 toolkit was not found at $CUDA_ROOT (set CUDA_HOME)" >&2
  exit 1
fi
export PATH="$CUDA_ROOT/bin:$PATH"

cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release -DCUDAToolkit_ROOT="$CUDA_ROOT" >/dev/null
cmake --build "$BUILD_DIR" -j "$JOBS"

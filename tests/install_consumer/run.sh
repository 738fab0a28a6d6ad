#!/usr/bin/env bash
# The CTest install_consumer: `cmake --install` of a built tree into a temporary prefix, then
# tests/install_consumer/ configured, built and run against it with find_package(moeblaze).
# Its C++ program must print the same memory plan as the installed CLI's `plan --json`.
# Usage: run.sh BUILD_DIR CMAKE CUDA_ROOT
set -euo pipefail
build=$1 cmake=$2 cuda_root=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

"$cmake" --install "$build" --prefix "$prefix" > "$work/install.log"
for f in lib/cmake/moeblaze/moeblazeConfig.cmake lib/cmake/moeblaze/moeblazeConfigVersion.cmake \
         include/moeblaze/runtime/moe_layer.hpp include/moeblaze/common.cuh include/moeblaze/capi/c_api.h \
         lib/libmoeblaze_runtime.a lib/libmoeblaze_c.so bin/moeblaze; do
  [ -e "$prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done
# Only moeblaze/ in include/, only public headers in it (not SQLite's wrappers, the NVRTC table,
# launch internals or device templates), each include of another layer spelled moeblaze/...
[ "$(ls "$prefix/include")" = moeblaze ] || { echo "include/ holds more than moeblaze/: $(ls "$prefix/include")"; exit 1; }
for f in cache/kernel_cache_sqlite.hpp cache/kernel_cache_rows.hpp runtime/nvrtc_library.hpp runtime/layer_buffers.hpp \
         generator/embedded_templates.hpp expert_gemms.cuh; do
  [ ! -e "$prefix/include/moeblaze/$f" ] || { echo "internal header installed: $f"; exit 1; }
done
if grep -rnE '#include "(core|generator|cache|runtime|testing|tuner|capi)/' "$prefix/include"; then
  echo "installed headers include another layer's header without moeblaze/"; exit 1
fi
# The CMake package names no file of this machine: SQLite and CUDA come from find_dependency.
if grep -nE '"/|;/|libsqlite3\.a|/usr/|cuda-13' "$prefix"/lib/cmake/moeblaze/moeblazeTargets*.cmake | grep -v _IMPORT_PREFIX; then
  echo "the installed CMake package names files of the build machine"; exit 1
fi

"$cmake" -S "$here" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix" -DCUDAToolkit_ROOT="$cuda_root" \
  -DCMAKE_BUILD_TYPE=Release > "$work/configure.log" || { cat "$work/configure.log"; exit 1; }
"$cmake" --build "$work/build" -j 2 > "$work/build.log" 2>&1 || { cat "$work/build.log"; exit 1; }

preset=qwen3-30b-a3b
"$work/build/plan_preset" "$preset" | tee "$work/plan.txt"
"$prefix/bin/moeblaze" plan --preset "$preset" --json > "$work/cli.json"
python3 - "$work/plan.txt" "$work/cli.json" <<'PY'
import json, sys
got = dict(line.split(" ", 1) for line in open(sys.argv[1]).read().splitlines())
cli = json.load(open(sys.argv[2]))["save-h"]
for key in ("saved_bytes", "peak_bytes"):
    if int(got[key]) != cli[key] or cli[key] <= 0:
        sys.exit(f"{key}: the consumer says {got[key]}, the CLI {cli[key]}")
print("consumer and CLI agree:", {k: cli[k] for k in ("saved_bytes", "peak_bytes")})
PY

"$work/build/c_abi_plan" | tee "$work/c.txt"
grep -q "^version [0-9]*\.[0-9]*\.[0-9]* abi matches the header$" "$work/c.txt"
grep -q "^bad topk names 'topk'$" "$work/c.txt"
echo "install consumer: ok"

#!/usr/bin/env bash
# The main job on a model preset: set up, build, then `moeblaze tune` (compiles every
# candidate kernel into the cache; on a GPU also times them and stores the winners), and on
# a GPU check the tuned layer against the CPU reference and benchmark it.
# Usage: scripts/run.sh [PRESET]   (default qwen3-30b-a3b; `build/bin/moeblaze presets` lists them)
# The cache is $MOEBLAZE_CACHE, else ~/.cache/moeblaze/kernels.db.
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-qwen3-30b-a3b}
scripts/setup.sh
BIN=${MOEBLAZE_BUILD_DIR:-build}/bin/moeblaze
"$BIN" tune --preset "$PRESET"
set +e
"$BIN" grad-check --preset "$PRESET" --tuned
rc=$?
set -e
if [ $rc -eq 3 ]; then
  echo "run: no GPU here: skipped timing, the GPU check and the benchmark (every candidate kernel was compiled into the cache above)"
  exit 0
fi
[ $rc -eq 0 ] || exit $rc
"$BIN" bench --preset "$PRESET"

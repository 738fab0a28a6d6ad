#!/usr/bin/env bash
# The main job on a model preset: set up, build, generate and compile every kernel of the
# layer (no GPU needed), then on a GPU check forward and backward against the CPU reference.
# Usage: scripts/run.sh [PRESET]   (default qwen3-30b-a3b; `build/bin/moeblaze presets` lists them)
set -euo pipefail
cd "$(dirname "$0")/.."
PRESET=${1:-qwen3-30b-a3b}
scripts/setup.sh
BIN=${MOEBLAZE_BUILD_DIR:-build}/bin/moeblaze
"$BIN" generate --preset "$PRESET"
set +e
"$BIN" grad-check --preset "$PRESET"
rc=$?
set -e
if [ $rc -eq 3 ]; then
  echo "run: no GPU here: skipped the forward/backward check on the GPU (kernels were generated and compiled above)"
  exit 0
fi
exit $rc

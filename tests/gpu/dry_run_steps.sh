#!/usr/bin/env bash
# CTest "device_steps" (no GPU): the GPU runner checked before it costs device time.
#   1. `tools/gpu_run.sh --help` documents every MOEBLAZE_DEV_* variable the tool reads and
#      every step it runs.
#   2. `tools/gpu_run.sh --dry-run all`, with every suite preset and every tile kind on each:
#      each check and bench becomes `moeblaze generate --check-only` on its shape and tiles,
#      so a tile that cannot run on its shape fails here instead of on the GPU machine.
# Usage: tests/gpu/dry_run_steps.sh BUILD_DIR
set -eu
BUILD=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
TOOL=tools/gpu_run.sh
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

help=$($TOOL --help)
missing=""
for v in $(grep -o 'MOEBLAZE_DEV_[A-Z_]*' "$TOOL" | sort -u); do
  printf '%s\n' "$help" | grep -q "^  $v " || missing="$missing $v"
done
for s in $($TOOL --list); do
  printf '%s\n' "$help" | grep -q "^  $s " || missing="$missing step:$s"
done
[ -z "$missing" ] || { echo "$TOOL --help does not describe:$missing"; exit 1; }

SUITE="mixtral-8x7b gpt-oss-20b olmoe-1b-7b qwen3-30b-a3b deepseek-v3 qwen3-next-80b"
rc=0
MOEBLAZE_DEV_OUT=$OUT MOEBLAZE_DEV_BUILD=$BUILD MOEBLAZE_DEV_PRESETS="$SUITE" MOEBLAZE_DEV_KIND_PRESETS="$SUITE" \
  MOEBLAZE_DEV_TILES="gpt-oss-20b:down_dgrad=128x128x64_w8x1_s3_wgmma" \
  $TOOL --dry-run all > "$OUT/stdout.txt" 2>&1 || rc=$?
checked=$(grep -c 'rc=0' "$OUT/summary.txt" || true)
failed=$(grep -E 'rc=[1-9]' "$OUT/summary.txt" || true)
if [ -n "$failed" ] || [ "$rc" -ne 0 ]; then
  echo "$TOOL --dry-run all: commands whose tiles cannot run on their shapes (exit $rc):"
  echo "$failed"
  tail -n 30 "$OUT/stdout.txt"
  exit 1
fi
[ "$checked" -gt 100 ] || { echo "only $checked commands checked"; cat "$OUT/stdout.txt"; exit 1; }
skipped=$(grep -c 'skipped: ' "$OUT/summary.txt" || true)

# 3. --precompile: the same steps' kernels compiled into a cache file (one cheap kind).
rm -rf "$OUT/logs" "$OUT/summary.txt"
MOEBLAZE_DEV_OUT=$OUT MOEBLAZE_DEV_BUILD=$BUILD MOEBLAZE_DEV_KINDS=wgmma $TOOL --precompile "$OUT/pre.db" kinds \
  > "$OUT/pre.txt" 2>&1 || { echo "$TOOL --precompile failed:"; cat "$OUT/pre.txt"; exit 1; }
binaries=$("$BUILD/bin/moeblaze" cache show --db "$OUT/pre.db" --json | python3 -c 'import json, sys; print(json.load(sys.stdin)["summary"]["binaries"])')
[ "$binaries" -gt 10 ] || { echo "--precompile stored $binaries binaries"; cat "$OUT/pre.txt"; exit 1; }
echo "$TOOL --dry-run all: $checked checks and benches, every tile legal for its shape ($skipped kind presets left out, each with its reason); --precompile stored $binaries binaries; --help complete"

#!/usr/bin/env bash
# CTest "device_steps" (no GPU): every check and bench of every tests/gpu/device_all.sh step,
# with DRY_RUN=1, becomes `moeblaze generate --check-only` on the same shape and tiles, so a
# step whose tiles are illegal for its shapes fails here instead of costing a device call.
# Usage: tests/gpu/dry_run_steps.sh BUILD_DIR
set -eu
BUILD=$(cd "$1" && pwd)
cd "$(dirname "$0")/../.."
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
steps=$(sed -n 's/^# Usage: .*steps: \(.*\) (default.*/\1/p' tests/gpu/device_all.sh)
[ -n "$steps" ] || { echo "no step list in device_all.sh's usage line"; exit 1; }
OUT=$OUT DRY_RUN=1 BUILD=$BUILD tests/gpu/device_all.sh $steps > "$OUT/stdout.txt" 2>&1 || true
checked=$(grep -c 'rc=0' "$OUT/summary.txt" || true)
failed=$(grep -E 'rc=[1-9]' "$OUT/summary.txt" || true)
if [ -n "$failed" ]; then
  echo "device_all.sh steps with tiles that cannot run:"
  echo "$failed"
  exit 1
fi
[ "$checked" -gt 20 ] || { echo "only $checked commands checked"; cat "$OUT/stdout.txt"; exit 1; }
echo "device_all.sh ($steps): $checked checks and benches, every tile legal for its shape"

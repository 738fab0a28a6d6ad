#!/usr/bin/env bash
# Runs on the GPU machine (device tool) from the repository root, with build/bin carried:
# the GPU test table, then grad-check on suite presets. Logs go to $OUT (or ./device-out).
# Usage: tests/gpu/device_run.sh [quick|suite]
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
BIN=build/bin
what=${1:-quick}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
status=0
step() {  # step NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%-40s rc=%-3s %5ss\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || { status=1; tail -n 30 "$OUT/$name.log"; }
}
[ "${SKIP_GPU_TESTS:-0}" = 1 ] || step gpu_tests 240 $BIN/moeblaze_gpu_tests
if [ "$what" = suite ] || [ "$what" = quick ]; then
  for p in ${PRESETS:-qwen3-30b-a3b}; do
    step "grad_${p}_save-h" 200 $BIN/moeblaze grad-check --preset "$p" --mode save-h
  done
fi
if [ "$what" = suite ]; then
  for p in ${PRESETS:-qwen3-30b-a3b}; do
    step "grad_${p}_recompute" 200 $BIN/moeblaze grad-check --preset "$p" --mode recompute
    step "grad_${p}_skewed" 200 $BIN/moeblaze grad-check --preset "$p" --router none --routing skewed
  done
fi
for f in "$OUT"/grad_*.log; do
  [ -f "$f" ] || continue
  printf '%s: %s | %s\n' "$(basename "$f" .log)" "$(grep -E '^(PASS|FAIL)' "$f")" "$(grep -E 'forward .* ms' "$f" | sed 's/ (second run.*//')"
done
exit $status

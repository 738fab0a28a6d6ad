#!/usr/bin/env bash
# Issue-4 checks on the GPU machine (build/bin carried): tune two presets, a second tune for
# stability, warm-cache load time, bench with tuned kernels, regress against a fresh
# baseline (must pass) and with a forced slower tile (must fail). Logs under $OUT.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MOEBLAZE_CACHE=/tmp/moeblaze-cache/kernels.db
BIN=build/bin/moeblaze
P1=${P1:-qwen3-30b-a3b}
P2=${P2:-mixtral-8x7b}
step() {  # step NAME EXPECTED_RC CMD...
  local name=$1 want=$2; shift 2
  local t0=$(date +%s)
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  printf '%-28s rc=%-3s (want %s) %5ss\n' "$name" "$rc" "$want" "$(( $(date +%s) - t0 ))" | tee -a "$OUT/summary.txt"
}
step tune1 0 $BIN tune --preset $P1 --budget 200 --baseline-out "$OUT/baseline-$P1.json"
step tune2 0 $BIN tune --preset $P1 --budget 200 --json
step bench_tuned 0 $BIN bench --preset $P1
step bench_default 0 $BIN bench --preset $P1 --no-cache
step regress_pass 0 $BIN regress --baseline "$OUT/baseline-$P1.json"
step regress_forced 1 $BIN regress --baseline "$OUT/baseline-$P1.json" --force up_proj=64x64x64_w2x2_s2 --force down_proj=64x64x64_w2x2_s2
step tune_p2 0 $BIN tune --preset $P2 --budget ${P2_BUDGET:-240}
step bench_p2 0 $BIN bench --preset $P2
$BIN cache show > "$OUT/cache_show.log" 2>&1
$BIN cache list > "$OUT/cache_list.log" 2>&1
tail -n 14 "$OUT/tune1.log"; grep -E "kernels:|step|forward" "$OUT"/bench_*.log; tail -n 3 "$OUT"/regress_*.log
cat "$OUT/summary.txt"

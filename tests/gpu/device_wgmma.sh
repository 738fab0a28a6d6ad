#!/usr/bin/env bash
# Verifies the EXPERIMENTAL wgmma tiles on the GPU machine (build/bin carried): grad-check
# with wgmma forced for up_proj, down_proj and router_logits on small shapes and suite
# presets, then bench against the mma.sync defaults. Logs under $OUT. Once these pass, drop
# the MOEBLAZE_EXPERIMENTAL_WGMMA gate in tuner/candidates.cpp.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
BIN=build/bin/moeblaze
WG="--tile up_proj=${UP:-128x128x64_w8x1_s3_wg} --tile down_proj=${DOWN:-128x256x64_w8x1_s3_wg} --tile router_logits=${RL:-128x64x64_w8x1_s4_wg}"
run() { local name=$1; shift; timeout 240 "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$?"; grep -E "^(PASS|FAIL)|forward .* ms|step .* ms" "$OUT/$name.log"; }
run small   $BIN forward-check -E 8 -K 2 -d 256 -n 128 -T 300 $WG
run small_g $BIN grad-check -E 64 -K 8 -d 256 -n 192 -T 1000 --router none --routing skewed $WG
for p in ${PRESETS:-qwen3-30b-a3b deepseek-v3}; do
  run "grad_$p" $BIN grad-check --preset "$p" $WG
  run "bench_${p}_wgmma" $BIN bench --preset "$p" --no-cache $WG
  run "bench_${p}_default" $BIN bench --preset "$p" --no-cache
done

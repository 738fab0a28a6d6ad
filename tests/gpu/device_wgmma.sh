#!/usr/bin/env bash
# Verifies the EXPERIMENTAL wgmma tiles on the GPU machine (build/bin carried): forward-check
# with wgmma on the forward GEMMs, then grad-check with wgmma on every GEMM, on small shapes and suite
# presets, then bench against the mma.sync defaults. Logs under $OUT. Once these pass, drop
# the MOEBLAZE_EXPERIMENTAL_WGMMA gate in tuner/candidates.cpp.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
BIN=build/bin/moeblaze
# Forward GEMMs first (K-major operands), then all GEMMs (the backward ones use transposed wgmma).
WGF="--tile up_proj=${UP:-128x128x64_w8x1_s3_wg} --tile down_proj=${DOWN:-128x256x64_w8x1_s3_wg} --tile router_logits=${RL:-128x64x64_w8x1_s4_wg}"
WG="$WGF"
for f in down_dgrad down_wgrad up_wgrad up_dgrad router_dgrad router_wgrad; do WG="$WG --tile $f=128x128x64_w8x1_s4_wg"; done
run() { local name=$1; shift; timeout 240 "$@" > "$OUT/$name.log" 2>&1; echo "$name rc=$?"; grep -E "^(PASS|FAIL)|forward .* ms|step .* ms" "$OUT/$name.log"; }
run small_f $BIN forward-check -E 8 -K 2 -d 256 -n 128 -T 300 $WGF
run small   $BIN grad-check -E 8 -K 2 -d 256 -n 128 -T 300 $WG
run small_g $BIN grad-check -E 64 -K 8 -d 256 -n 192 -T 1000 --router none --routing skewed $WG
for p in ${PRESETS:-qwen3-30b-a3b deepseek-v3}; do
  run "grad_$p" $BIN grad-check --preset "$p" $WG
  run "bench_${p}_wgmma" $BIN bench --preset "$p" --no-cache $WG
  run "bench_${p}_default" $BIN bench --preset "$p" --no-cache
done

#!/usr/bin/env bash
# Session nine, call 2: main with the rolled down_dgrad epilogue (call 1's winner, up_proj left
# unrolled) -- its C++ GPU tests, then two default-tile questions, A/B in one call (ABAB, 20 steps):
#   a. the d = 2048 shapes (olmoe, qwen3, qwen3-next): down_dgrad `_wg` 128x128 s3 (default, two
#      blocks per SM) against the persistent 128x256 `_wsp_tma`. Run 10 had the persistent tile
#      3% slower there (3.78 vs 3.66 on olmoe); since then its epilogue lost its IEEE divides
#      (-19% on the d >= 2880 shapes) and its unrolled rows (-3..-5%), `_wg`'s only ~-3%.
#      Prediction: persistent 2.9-3.1 ms against _wg's 3.35 on olmoe (step -0.3 ms).
#   b. gpt-oss / qwen3 sit on the token-aware rule's edge (T K / E = 2048 slots per expert ->
#      the `_tstore` s3 weight gradients): the 4-stage direct-store tiles instead.
# Carry ["build/bin","build/lib"].
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
OUT=$OUT/checks DEADLINE_S=120 $D gpu > /dev/null
cat $OUT/checks/summary.txt
P=128x256x64_w8x1_s4_wsp_tma
bench() {  # bench LABEL PRESET ARGS...
  local l=$1 p=$2; shift 2
  if [ -n "${DRY_RUN:-}" ]; then build/bin/moeblaze generate --check-only --preset $p "$@" | tail -1; return; fi
  echo "$l $p: $(timeout 60 build/bin/moeblaze bench --preset $p --no-cache --steps 20 "$@" 2>&1 \
    | grep -E '^ *(down_dgrad|up_wgrad|down_wgrad) |step |rror' | tr -s ' ' | tr '\n' ' ')"
}
{
for p in olmoe-1b-7b qwen3-30b-a3b qwen3-next-80b; do
  for r in 1 2; do bench default $p; bench dgrad-persistent $p --tile down_dgrad=$P; done
done
for p in gpt-oss-20b qwen3-30b-a3b; do
  for r in 1 2; do bench default $p; bench wgrad-s4 $p --tile up_wgrad=$P --tile down_wgrad=$P; done
done
} | tee $OUT/ab.txt
echo "total $(( $(date +%s) - T0 )) s"

#!/usr/bin/env bash
# Session eight, call 6: build-ht's fault isolated, and where a tile's time goes.
#   build-ht/  wip/dgrad-h-tma (faults on E=8 K=2 d=2048 n=1024 T=4096, call 5)
#   build-hx/  wip/dgrad-h-tma-debug, MB_EXPERIMENT_GLOBAL_H=1: the tail's TMA, waits and
#              releases run, but the epilogue reads H from global memory (as main)
#   build-ha/  the same branch, MB_EXPERIMENT_ASSERT=1: bounds asserts on the epilogue's
#              stores and the tail's stage index (a broken one traps: ILLEGAL_INSTRUCTION)
#   build-hp/  the same branch, MB_EXPERIMENT_TRACE=1: block 0 prints clock64 stamps of tiles
#              1-4 (consumer warps 0 and 7: start, mainloop end, H ready, epilogue done, end;
#              the producer: start, tail published)
# Carry ["build-ht","build-hx","build-ha","build-hp"].
set -u
T0=$(date +%s)
HT="--tile down_dgrad=128x256x64_w8x1_s4_wsp_tma"
S="grad-check -T 4096 -E 8 -K 2 -d 2048 -n 1024 --router softmax $HT"
for b in build-ht build-hx build-ha; do
  [ -n "${DRY_RUN:-}" ] && { echo "$b: dry"; continue; }
  echo "== $b: $(timeout 60 $b/bin/moeblaze $S 2>&1 | grep -E 'PASS|FAIL|error' | head -3 | tr '\n' ' ')"
done | tee $OUT/fault.txt
for p in gpt-oss-20b mixtral-8x7b; do
  [ -n "${DRY_RUN:-}" ] && { echo "trace $p: dry"; continue; }
  echo "== trace $p"; timeout 60 build-hp/bin/moeblaze bench --preset $p --no-cache > $OUT/trace_$p.log 2>&1
  grep -E 'TRACE' $OUT/trace_$p.log | head -15; grep -E '^ *down_dgrad |step ' $OUT/trace_$p.log; gzip $OUT/trace_$p.log
done | tee $OUT/trace.txt
echo "total $(( $(date +%s) - T0 )) s"

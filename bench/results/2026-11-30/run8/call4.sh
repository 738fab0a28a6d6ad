#!/usr/bin/env bash
# Written in session five for the next device call (no device time was left to run it):
# 1. Nsight Compute on deepseek-v3's weight gradients (default tiles), whose output tiles are
#    8 k-steps deep and cost ~7 us each beyond their mainloop (bench/NOTES.md v0.6, 2 and 4):
#    how much of that is the epilogue, how much the pipeline refill.
# 2. The regress baseline (bench/baselines/qwen3-30b-a3b.json still holds mma.sync timings
#    from the first session): tune qwen3-30b-a3b and write its baseline under $OUT.
set -u
OUT=$OUT/a DEADLINE_S=${DEADLINE_S:-400} PROFILE_PRESET=deepseek-v3 PROFILE_FAMILIES="up_wgrad|down_wgrad" \
  tests/gpu/device_all.sh profile > /dev/null
build/bin/moeblaze tune --preset qwen3-30b-a3b --budget 60 --candidates 8 \
  --baseline-out "$OUT/qwen3-30b-a3b.json" > "$OUT/tune_baseline.log" 2>&1
build/bin/moeblaze regress --baseline "$OUT/qwen3-30b-a3b.json" >> "$OUT/tune_baseline.log" 2>&1
echo "baseline: rc=$? $(tail -n 2 "$OUT/tune_baseline.log" | tr '\n' ' ')"
cat $OUT/a/summary.txt

#!/usr/bin/env bash
# Written at the end of session eight for the next session's first device call. Builds carried
# side by side (each: git checkout BRANCH; cmake --build build -j2; mkdir -p DIR; cp -r build/bin
# build/lib DIR/; back to main and rebuild build/):
#   build/     main
#   build-ro/  branch wip/dgrad-epi-rolled: the epilogues' loop over a thread's two rows kept
#              rolled (selects pick the accumulator pair): down_dgrad 82 -> 54 KiB of code
#              (persistent 128x256), 62 -> 45 KiB (_wg 128x128), up_proj 48 -> 34 KiB; no spills
#              (CPU tests pass); call 8 measured down_dgrad -3.2% (gpt-oss), -4.7% (mixtral)
#              and ran the small checks and gpt-oss's grad-check; the rest of its checks are here
#   build-b4/  branch wip/dgrad-batch4: main's 16-byte down_dgrad epilogue with 4 chunks of H per
#              load batch instead of 2 (half the dependent round trips; 8 spills, 4 does not)
#   build-rb4/ branch wip/dgrad-rolled-batch4: both (CPU tests pass on it)
# Carry ["build/bin","build/lib","build-ro","build-b4","build-rb4"] (~50 MB).
# Check without a GPU first: DRY_RUN=1 OUT=/tmp/x bash bench/results/2026-11-30/run11/next_call.sh
# 1. Confirm the instruction-cache reading (bench/NOTES.md v0.9, 6-7): ncu's stall reasons on
#    down_dgrad, main against the rolled build: "no instruction" should be a large share on main
#    and fall with the code.
# 2. A/B benches on all six suite shapes. Prediction (after call 8): down_dgrad -3..-5% on every
#    shape (the _wg tile of the d = 2048 shapes included), up_proj ~-1%.
#    The stall reasons say what the next cut needs: if "no instruction" is small on both builds,
#    the epilogue is latency-bound (2 warps a scheduler) and wants more independent work per warp.
# 3. The rolled build's checks: C++ GPU tests, the small checks, the default grad-checks.
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
export PATH=/usr/local/cuda/bin:$PATH
M="regex:smsp__average_warps_issue_stalled_(no_instruction|long_scoreboard|wait|barrier|math_pipe_throttle|short_scoreboard|lg_throttle|branch_resolving|mio_throttle)_per_issue_active\.ratio,smsp__inst_executed.sum,gpu__time_duration.sum"
for b in build build-ro; do
  for p in gpt-oss-20b mixtral-8x7b; do
    [ -n "${DRY_RUN:-}" ] && { echo "ncu $b $p: dry"; continue; }
    echo "== ncu $b $p"; timeout 120 ncu --metrics "$M" -k regex:down_dgrad -c 1 $b/bin/moeblaze bench --preset $p --no-cache 2>&1 \
      | grep -E 'stalled|inst_executed|gpu__time|==ERR|rror' | tr -s ' '
  done
done | tee $OUT/ncu.txt
for p in mixtral-8x7b gpt-oss-20b olmoe-1b-7b qwen3-30b-a3b deepseek-v3 qwen3-next-80b; do
  B="build build-ro"
  case $p in mixtral-8x7b|gpt-oss-20b|deepseek-v3) B="$B build-b4 build-rb4" ;; esac  # the persistent tile's shapes
  for b in $B; do
    [ -n "${DRY_RUN:-}" ] && { $b/bin/moeblaze generate --check-only --preset $p | tail -1; continue; }
    echo "$b $p: $(timeout 60 $b/bin/moeblaze bench --preset $p --no-cache 2>&1 | grep -E '^ *(down_dgrad|up_proj) |step ' | tr -s ' ' | tr '\n' ' ')"
  done
done | tee $OUT/ab.txt
# The checks on the rolled build (rb4 instead if the A/B says it is the one to merge: BUILD=build-rb4).
OUT=$OUT/checks BUILD=${CHECK_BUILD:-build-ro} DEADLINE_S=$(left 560) DGW_PRESETS= DGW_BENCH= $D gpu dgradwide defaults > /dev/null
cat $OUT/checks/summary.txt
echo "total $(( $(date +%s) - T0 )) s"

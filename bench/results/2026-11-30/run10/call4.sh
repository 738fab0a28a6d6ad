#!/usr/bin/env bash
# Session seven, device call 4: suite run 10 on main's defaults (checked in call 3): random and
# skewed routing on the six suite shapes and the token sweep; then, with the time left, Nsight
# Compute on mixtral-8x7b's down_dgrad (the persistent 128x256 tile) and up_proj (same gathered
# A, same tile size), with the stall reasons: where down_dgrad's extra time per k-step goes.
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
OUT=$OUT/c DEADLINE_S=$(left 400) SUITE_SHAPES=mixtral-8x7b,gpt-oss-20b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3,qwen3-next-80b \
  SUITE_ROUTING=random,skewed SUITE_ARGS=--sweep $D bench > /dev/null
cat $OUT/c/summary.txt
grep -E "^\| [a-z0-9-]+ \| random \| (16384|32768) \| moeblaze \|" $OUT/c/suite/table.md 2>/dev/null
if [ "$(left 560)" -gt 120 ] && [ -z "${DRY_RUN:-}" ]; then
  mkdir -p $OUT/p
  export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MOEBLAZE_CACHE=/tmp/moeblaze-cache.db
  timeout $(( $(left 570) - 10 )) ncu --target-processes all --launch-count 2 --section SpeedOfLight \
    --section WarpStateStats --section MemoryWorkloadAnalysis -k "regex:mb_(down_dgrad|up_proj)_" \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    build/bin/moeblaze bench --preset mixtral-8x7b --no-cache --steps 10 > $OUT/p/ncu_mixtral-8x7b.txt 2>&1
  echo "ncu rc=$?"
  grep -E "mb_|Duration|Compute \(SM\)|Memory Throughput|L2 Hit|Warp Cycles Per Issued|issue_stalled_(barrier|long_scoreboard|wait|math|mio|lg_throttle|short)" \
    $OUT/p/ncu_mixtral-8x7b.txt | grep -v "==PROF" | head -60
fi
tar czf $OUT/all.tgz -C $OUT c $( [ -d $OUT/p ] && echo p ) && rm -rf $OUT/c $OUT/p
echo "total $(( $(date +%s) - T0 )) s"

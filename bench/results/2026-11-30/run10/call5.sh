#!/usr/bin/env bash
# Session seven, device call 5 (call 4's profile caught up_proj twice: the chunked forward
# launches it per slot chunk): Nsight Compute on down_dgrad alone, the persistent 128x256 tile
# (mixtral-8x7b, gpt-oss-20b), with the stall reasons, against call 4's up_proj.
set -u
mkdir -p $OUT/p
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MOEBLAZE_CACHE=/tmp/moeblaze-cache.db
for p in mixtral-8x7b gpt-oss-20b; do
  timeout 100 ncu --target-processes all --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --section MemoryWorkloadAnalysis -k "regex:mb_down_dgrad_" \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    build/bin/moeblaze bench --preset $p --no-cache --steps 10 > $OUT/p/ncu_dgrad_$p.txt 2>&1
  echo "$p ncu rc=$?"
done
grep -E "mb_|Duration|Compute \(SM\)|Memory Throughput|L2 Hit|DRAM Throughput|Warp Cycles Per Issued|issue_stalled_(barrier|long_scoreboard|wait|math|mio|lg_throttle|short|sleeping|no_inst|dispatch|selected|membar|drain)" \
  $OUT/p/ncu_dgrad_*.txt | grep -v "==PROF" | head -70
tar czf $OUT/p.tgz -C $OUT p && rm -rf $OUT/p

#!/usr/bin/env bash
# Session six, device call 4 (the session's last minutes): Nsight Compute on the two kernels
# that lose most to their floors after run 9 (mixtral-8x7b: down_dgrad `_wg` at ~350 TFLOP/s
# per k-step, up_proj `_wsp_tma`), with the warp stall reasons per issued instruction, so the
# next session's down_dgrad work (H prefetched by TMA, stores by TMA) starts from a measured
# breakdown. ncu locks the SM clock (1.34 GHz on this machine): compare ratios, not times.
set -u
mkdir -p $OUT/p
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export MOEBLAZE_CACHE=/tmp/moeblaze-cache.db
NCU="ncu --target-processes all --launch-count 2 --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis"
for p in mixtral-8x7b gpt-oss-20b; do
  timeout 150 $NCU -k "regex:mb_(down_dgrad|up_proj)_" \
    --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
    build/bin/moeblaze bench --preset $p --no-cache --steps 10 > $OUT/p/ncu_$p.txt 2>&1
  echo "$p rc=$?"
  if ! grep -q "issue_stalled" $OUT/p/ncu_$p.txt; then  # fallback: the section's own details
    timeout 120 $NCU --print-details all -k "regex:mb_(down_dgrad|up_proj)_" \
      build/bin/moeblaze bench --preset $p --no-cache --steps 10 > $OUT/p/ncu_${p}_details.txt 2>&1
    echo "$p fallback rc=$?"
  fi
done
grep -E "mb_|issue_stalled|Duration|Compute \(SM\)|Warp Cycles Per Issued" $OUT/p/ncu_*.txt | grep -v "^.*==PROF" | head -120
tar czf $OUT/p.tgz -C $OUT p && rm -rf $OUT/p

#!/usr/bin/env bash
# Session nine, call 4: what limits the GEMMs that miss their floor most (for issue 5's closing
# gap analysis), on main as suite run 12 measured it: Nsight Compute's speed of light, pipe
# utilisation and stall reasons for gpt-oss-20b's first up_proj, down_wgrad and up_wgrad
# launches (gathered operands by cp.async: 535 / 472 / 443 TFLOP/s in run 12) and its up_dgrad
# (all-TMA, 648: the reference), and deepseek-v3's up_wgrad (393 TFLOP/s, 8 k-steps a tile).
# Clocks as ncu sets them (locked to base): ratios only, not times.
# Carry ["build/bin","build/lib"].
set -u
T0=$(date +%s)
export PATH=/usr/local/cuda/bin:$PATH
M="regex:smsp__average_warps_issue_stalled_(no_instruction|long_scoreboard|wait|barrier|math_pipe_throttle|short_scoreboard|lg_throttle|branch_resolving|mio_throttle|sleeping|dispatch_stall|membar|misc|not_selected|selected|tex_throttle|drain|imc_miss)_per_issue_active\.ratio"
prof() {  # prof NAME PRESET KERNEL_REGEX COUNT
  [ -n "${DRY_RUN:-}" ] && { build/bin/moeblaze generate --check-only --preset $2 | tail -1; return; }
  timeout 200 ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --metrics "$M" \
    -k "regex:$3" -c $4 build/bin/moeblaze bench --preset $2 --no-cache > $OUT/$1.txt 2>&1
  echo "== $1 rc=$?"
  grep -E "  mb_|Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Tensor|Issue Slots Busy|Executed Ipc A|stalled_(long_scoreboard|wait|barrier|math_pipe|short_scoreboard|no_instruction|sleeping|selected|not_selected|dispatch|mio)" \
    $OUT/$1.txt | grep -v "==PROF" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | tr -s ' '
}
prof gptoss gpt-oss-20b "mb_(up_proj|down_wgrad|up_wgrad|up_dgrad)_" 4
prof deepseek deepseek-v3 "mb_up_wgrad_" 1
echo "total $(( $(date +%s) - T0 )) s"

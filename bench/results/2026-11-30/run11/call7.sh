#!/usr/bin/env bash
# Session eight, call 7 (the session's last): the logistic function by rcp.approx (branch
# wip/fast-act) against main, then every check the change touches, then the suite.
#   build/     main
#   build-fm/  wip/fast-act: silu/swiglu's sigmoid = rcp.approx(1 + exp(-a)) instead of two
#              IEEE divides per element (down_dgrad's SASS 9761 -> 5500 lines, no slow-path calls)
# Carry ["build/bin","build/lib","build-fm"].
# Why (call 6's clock stamps): H is in shared memory within ~2k cycles of the mainloop's end, yet
# the epilogue loop then runs 47-102k cycles (gpt-oss ~72k) for ~15k cycles of issue; the
# fully unrolled epilogue (~7k instructions, ~110 KB of code) streams through the instruction
# cache every tile. Prediction: the epilogue ~halves: mixtral down_dgrad 10.4 -> ~8 ms, gpt-oss
# 3.1 -> ~2.4; up_proj (the same activation, unrolled) a few % faster.
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
for p in mixtral-8x7b gpt-oss-20b; do
  for b in build build-fm; do
    [ -n "${DRY_RUN:-}" ] && { echo "$b $p: dry"; continue; }
    echo "$b $p: $(timeout 60 $b/bin/moeblaze bench --preset $p --no-cache 2>&1 | grep -E '^ *(down_dgrad|up_proj) |step ' | tr -s ' ' | tr '\n' ' ')"
  done
done | tee $OUT/ab.txt
OUT=$OUT/checks BUILD=build-fm DEADLINE_S=$(left 300) DGW_PRESETS= DGW_BENCH= $D gpu dgradwide defaults > /dev/null
cat $OUT/checks/summary.txt
OUT=$OUT/s BUILD=build-fm DEADLINE_S=$(left 530) \
  SUITE_SHAPES=mixtral-8x7b,gpt-oss-20b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3,qwen3-next-80b SUITE_ROUTING=random SUITE_ARGS="--impls moeblaze,torch-grouped_mm" $D bench > /dev/null
cat $OUT/s/summary.txt
grep -E "^\| [a-z0-9-]+ \| random \| (16384|32768) \| moeblaze \|" $OUT/s/suite/table.md 2>/dev/null
echo "total $(( $(date +%s) - T0 )) s"

#!/usr/bin/env bash
# Written at the end of session six for the next session's first device call (no device time
# was left to run it). Two builds carried side by side:
#   build/     main (bin/, lib/)
#   build-dt/  branch wip/dgrad-tstore (bin/, lib/, and its tests/gpu/device_all.sh copied in):
#              git checkout wip/dgrad-tstore; cmake --build build -j2; mkdir -p build-dt;
#              cp -r build/bin build/lib tests/gpu/device_all.sh build-dt/; git checkout main;
#              cmake --build build -j2. Carry ["build/bin","build/lib","build-dt"].
# Check without a GPU first: DRY_RUN=1 BUILD=build-dt build-dt/device_all.sh dgradts.
# 1. down_dgrad (bench/NOTES.md v0.7, 5 and the sixth session's next steps, item 1): the
#    TMA-staged epilogue with hg from registers at 5 and 4 stages, and the same persistent
#    mainloop with the direct epilogue at 4 and 6 stages (how much of the ~1 us per k-step is
#    the mainloop's depth), against the `_wg` default, on gpt-oss-20b and mixtral-8x7b.
#    Prediction if depth is the limit: s6 direct and s5 staged well below s4 (call 5: s3 -> s4
#    bought 9%); the staged s5 below `_wg` (11.40 ms on mixtral) only if its k-step falls to
#    ~0.6 us.
# 2. olmoe-1b-7b's tuning (the E / K rule gives it `_tstore` weight gradients, measured 5-6%
#    slower there): `tune` should pick the 4-stage tiles.
set -u
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
BUILD=build-dt OUT=$OUT/dt DEADLINE_S=$(left 330) DTS_PRESETS="gpt-oss-20b mixtral-8x7b" \
  DTS_BENCH="gpt-oss-20b mixtral-8x7b" build-dt/device_all.sh dgradts > /dev/null
OUT=$OUT/t DEADLINE_S=$(left 450) PRESETS=olmoe-1b-7b TUNE_BUDGET=30 TUNE_CANDIDATES=8 \
  tests/gpu/device_all.sh tune > /dev/null
cat $OUT/dt/summary.txt $OUT/t/summary.txt
tar czf $OUT/all.tgz -C $OUT dt t && rm -rf $OUT/dt $OUT/t
echo "total $(( $(date +%s) - T0 )) s"

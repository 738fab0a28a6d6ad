#!/usr/bin/env bash
# Written at the end of session seven for the next session's first device call. Builds carried
# side by side (each: git checkout BRANCH; edit as said; cmake --build build -j2; mkdir -p DIR;
# cp -r build/bin build/lib DIR/; then git checkout -- templates; back to main and rebuild):
#   build/      main
#   build-ep/   branch wip/dgrad-epi-prefetch as committed: the consumers ask L2 for their
#               warp's H lines 8 k steps before down_dgrad's mainloop ends (a tail hook)
#   build-ep0/  the same branch with MB_DGRAD_H_PREFETCH_LEAD set to 0 in expert_gemms.cuh
#               (the prefetch at the epilogue's start)
#   build-ne/   branch wip/dgrad-noepi with MB_EXPERIMENT_NO_EPILOGUE defined (timing floor:
#               the mainloop alone; wrong results)
# Carry ["build/bin","build/lib","build-ep","build-ep0","build-ne"] (~51 MB).
# Check without a GPU first: DRY_RUN=1 OUT=/tmp/x bash bench/results/2026-11-30/run10/next_call.sh
# Prediction (bench/NOTES.md v0.8, 7b and next steps 1c): the epilogue (mixtral ~41 us per
# tile, 4.45 ms of down_dgrad's 10.4) waits on DRAM once instead of once per batch: mixtral
# down_dgrad 10.4 -> ~8 ms, gpt-oss 3.1 -> ~2.5 (floors from build-ne: 5.9 and 1.7); the
# 8-step lead below the 0 one if the DRAM round trip is still exposed at the epilogue's start.
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
P="mixtral-8x7b gpt-oss-20b deepseek-v3"
for b in build-ep build-ep0; do
  BUILD=$b OUT=$OUT/$b DEADLINE_S=$(left 300) DGW_PRESETS="gpt-oss-20b" DGW_ONLY=1 DGW_BENCH="$P" \
    $D dgradwide > /dev/null
done
for b in build build-ne; do
  for p in $P; do
    [ -n "${DRY_RUN:-}" ] && { echo "$b $p: dry run"; continue; }
    echo "$b $p: $(timeout 60 $b/bin/moeblaze bench --preset $p --no-cache 2>&1 | grep -E '^ *down_dgrad |step ' | tr -s ' ' | tr '\n' ' ')"
  done
done | tee $OUT/main_and_floor.txt
cat $OUT/build-ep/summary.txt $OUT/build-ep0/summary.txt
tar czf $OUT/all.tgz -C $OUT build-ep build-ep0 main_and_floor.txt && rm -rf $OUT/build-ep $OUT/build-ep0
echo "total $(( $(date +%s) - T0 )) s"

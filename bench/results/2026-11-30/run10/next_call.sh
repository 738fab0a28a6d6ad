#!/usr/bin/env bash
# Written at the end of session seven for the next session's first device call. Builds carried
# side by side (each: git checkout BRANCH; cmake --build build -j2; mkdir -p DIR; cp -r
# build/bin build/lib DIR/; then back to main and rebuild build/):
#   build/     main
#   build-ep/  branch wip/dgrad-epi-prefetch (the consumers prefetch their warp's H lines into
#              L2 at the start of down_dgrad's epilogue)
#   build-ne/  branch wip/dgrad-noepi with MB_EXPERIMENT_NO_EPILOGUE defined (timing floor:
#              the mainloop alone; wrong results)
# Carry ["build/bin","build/lib","build-ep","build-ne"].
# Check without a GPU first: DRY_RUN=1 OUT=/tmp/x bash bench/results/2026-11-30/run10/next_call.sh
# Prediction (bench/NOTES.md v0.8, 7b and next steps 1c): the epilogue (mixtral ~41 us per
# tile, 4.45 ms of down_dgrad's 10.4) waits on DRAM once instead of once per batch: mixtral
# down_dgrad 10.4 -> ~8 ms, gpt-oss 3.1 -> ~2.5 (floors from build-ne: 5.9 and 1.7).
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
P="mixtral-8x7b gpt-oss-20b deepseek-v3"
BUILD=build-ep OUT=$OUT/ep DEADLINE_S=$(left 300) DGW_PRESETS="gpt-oss-20b" DGW_ONLY=1 DGW_BENCH="$P" \
  $D dgradwide > /dev/null
for b in build build-ne; do
  for p in $P; do
    [ -n "${DRY_RUN:-}" ] && { echo "$b $p: dry run"; continue; }
    echo "$b $p: $(timeout 60 $b/bin/moeblaze bench --preset $p --no-cache 2>&1 | grep -E '^ *down_dgrad |step ' | tr -s ' ' | tr '\n' ' ')"
  done
done | tee $OUT/main_and_floor.txt
cat $OUT/ep/summary.txt
tar czf $OUT/all.tgz -C $OUT ep main_and_floor.txt && rm -rf $OUT/ep
echo "total $(( $(date +%s) - T0 )) s"

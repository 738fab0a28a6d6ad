#!/usr/bin/env bash
# Written in session five for the first device call of the next session (not run: no device
# time was left). One call, three builds carried side by side:
#   build/     main (bin/, lib/)
#   build-ts/  branch wip/wgrad-tma-store (bin/, lib/, and its tests/gpu/device_all.sh copied in)
#   build-ra/  branch wip/producer-runahead (the same)
#   build-192/ branch wip/bn192 (the same)
# e.g. for b in wgrad-tma-store:ts producer-runahead:ra bn192:192: git checkout wip/${b%%:*};
# cmake --build build -j2; mkdir -p build-${b#*:}; cp -r build/bin build/lib
# tests/gpu/device_all.sh build-${b#*:}/; then back to main and rebuild; carry
# ["build/bin","build/lib","build-ts","build-ra","build-192"]. Before the call, check each
# branch's steps without a GPU: DRY_RUN=1 BUILD=build-ts build-ts/device_all.sh tstore (etc.).
set -u
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
# 1. main: ncu on deepseek-v3's weight gradients, the regress baseline (call4.sh)
OUT=$OUT/main DEADLINE_S=$(left 170) bash bench/results/2026-11-30/run8/call4.sh > /dev/null 2>&1
# 2. the weight gradients' TMA-store epilogue: checks, grad-checks, benches against the defaults
BUILD=build-ts OUT=$OUT/ts DEADLINE_S=$(left 360) TMA_PRESETS="gpt-oss-20b mixtral-8x7b" \
  TSTORE_BENCH="deepseek-v3 mixtral-8x7b" build-ts/device_all.sh tstore > /dev/null
# 3. the producer that runs ahead across tiles (every ws/wsp kernel): small checks of both
#    kinds, default grad-checks on two shapes, benches (compare with ts/default_bench_*)
BUILD=build-ra OUT=$OUT/ra DEADLINE_S=$(left 520) WG_PRESETS= PRESETS="mixtral-8x7b qwen3-30b-a3b" \
  build-ra/device_all.sh ws wsp defaults > /dev/null
for p in deepseek-v3 mixtral-8x7b; do
  [ "$(left 520)" -gt 40 ] && build-ra/bin/moeblaze bench --preset $p --no-cache > $OUT/ra/bench_$p.txt 2>&1
done
# 4. 192-column tiles on gpt-oss-20b: checks, grad-check, bench against the defaults
BUILD=build-192 OUT=$OUT/192 DEADLINE_S=$(left 585) build-192/device_all.sh bn192 > /dev/null
for v in main ts ra 192; do echo "== $v"; cat $OUT/$v/summary.txt 2>/dev/null; done
cat $OUT/main/a/summary.txt 2>/dev/null
tar czf $OUT/all.tgz -C $OUT main ts ra 192 && rm -rf $OUT/main $OUT/ts $OUT/ra $OUT/192  # one file back
echo "total $(( $(date +%s) - T0 )) s"

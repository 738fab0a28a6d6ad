#!/usr/bin/env bash
# Session five, device call 1: the three unverified branches against main, one GPU, one call.
# Carried: build/{bin,lib} (main) and build-{gr,tma,ds}/ (bin/moeblaze, lib/, and the branch's
# own device_all.sh, since the steps tmaall/dgradstaged exist only on their branches).
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
# main: the down_wgrad _wsp_tma tile on two presets (to make it the default), reference benches
MOEBLAZE_CACHE=/tmp/c-main.db OUT=$OUT/main DEADLINE_S=$(left 130) \
  TILE_CHECKS="mixtral-8x7b:down_wgrad=128x256x64_w8x1_s4_wsp_tma deepseek-v3:down_wgrad=128x256x64_w8x1_s4_wsp_tma" \
  $D tilecheck > /dev/null
for p in mixtral-8x7b deepseek-v3 qwen3-30b-a3b; do
  build/bin/moeblaze bench --preset $p --no-cache > $OUT/main/bench_$p.txt 2>&1
done
# wip/dgrad-staged: down_dgrad's epilogue through shared memory
BUILD=build-ds MOEBLAZE_CACHE=/tmp/c-ds.db OUT=$OUT/ds DEADLINE_S=$(left 250) \
  STAGED_PRESETS="mixtral-8x7b" STAGED_BENCH="mixtral-8x7b deepseek-v3 qwen3-30b-a3b" \
  build-ds/device_all.sh dgradstaged > /dev/null
# wip/gathered-rows: the MN-major gathered loader (every wgrad tile kind)
BUILD=build-gr MOEBLAZE_CACHE=/tmp/c-gr.db OUT=$OUT/gr DEADLINE_S=$(left 420) WG_PRESETS=qwen3-30b-a3b \
  TMA_PRESETS=mixtral-8x7b TMAW_BENCH="mixtral-8x7b deepseek-v3" \
  build-gr/device_all.sh ws tmaw > /dev/null
build-gr/bin/moeblaze bench --preset mixtral-8x7b --no-cache > $OUT/gr/bench_mixtral-8x7b.txt 2>&1
# wip/tma-all: TMA for down_proj's h (default tile), up_dgrad, down_dgrad
BUILD=build-tma MOEBLAZE_CACHE=/tmp/c-tma.db OUT=$OUT/tma DEADLINE_S=$(left 545) PRESETS="gpt-oss-20b" \
  TMA_PRESETS=mixtral-8x7b TMAW_BENCH=mixtral-8x7b build-tma/device_all.sh tmaall defaults > /dev/null
build-tma/bin/moeblaze bench --preset mixtral-8x7b --no-cache > $OUT/tma/bench_mixtral-8x7b.txt 2>&1
for v in main ds gr tma; do echo "== $v"; cat $OUT/$v/summary.txt 2>/dev/null; done
tar czf $OUT/all.tgz -C $OUT main ds gr tma && rm -rf $OUT/main $OUT/ds $OUT/gr $OUT/tma  # one file back
echo "total $(( $(date +%s) - T0 )) s"

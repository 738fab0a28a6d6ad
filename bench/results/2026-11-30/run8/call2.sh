#!/usr/bin/env bash
# Session five, device call 2: main with the three branches merged and the new defaults
# (TMA everywhere it is legal; up_wgrad/down_wgrad _wsp_tma, up_dgrad _ws_tma): the small
# checks of the merged tile kinds, the C++ GPU tests, the default grad-check on all six
# shapes, the Python tests, then the whole suite (random + skewed routing, token sweep).
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
OUT=$OUT/a DEADLINE_S=$(left 330) STAGED_PRESETS= STAGED_BENCH= TMA_PRESETS= TMAW_BENCH= \
  $D dgradstaged tmaall gpu defaults py > /dev/null
OUT=$OUT/c DEADLINE_S=$(left 575) SUITE_SHAPES=mixtral-8x7b,gpt-oss-20b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3,qwen3-next-80b \
  SUITE_ROUTING=random,skewed SUITE_ARGS=--sweep $D bench > /dev/null
cat $OUT/a/summary.txt $OUT/c/summary.txt
cat $OUT/c/suite/table.md 2>/dev/null | head -60
echo "total $(( $(date +%s) - T0 )) s"

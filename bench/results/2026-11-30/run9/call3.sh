#!/usr/bin/env bash
# Session six, device call 3: main with both branches merged (bn192 defaults for gpt-oss,
# _tstore weight gradients where E >= 8K, the 192-wide fix): the TMA-store small checks, the
# C++ GPU tests, the default grad-check on all six shapes (and the chunked small shapes), the
# Python tests, then the whole suite (random + skewed routing, token sweep).
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
OUT=$OUT/a DEADLINE_S=$(left 330) TMA_PRESETS= TSTORE_BENCH= $D tstore gpu defaults py > /dev/null
OUT=$OUT/c DEADLINE_S=$(left 580) SUITE_SHAPES=mixtral-8x7b,gpt-oss-20b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3,qwen3-next-80b \
  SUITE_ROUTING=random,skewed SUITE_ARGS=--sweep $D bench > /dev/null
cat $OUT/a/summary.txt $OUT/c/summary.txt
grep -E "^\| [a-z0-9-]+ \| random \| (16384|32768) \| moeblaze \|" $OUT/c/suite/table.md 2>/dev/null
tar czf $OUT/all.tgz -C $OUT a c && rm -rf $OUT/a $OUT/c
echo "total $(( $(date +%s) - T0 )) s"

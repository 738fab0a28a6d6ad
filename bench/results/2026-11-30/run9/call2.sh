#!/usr/bin/env bash
# Session six, device call 2. Builds carried: build/ (main 2d9ea69: bn192 defaults for gpt-oss),
# build-ts/ (wip/wgrad-tma-store rebased on main, straddling tiles back on direct stores; its
# defaults are main's), build-tsd/ (the same plus _tstore 128x256 s3 as the weight gradients'
# default tile, branch wip/tstore-default).
# 1. The tstore step on build-ts: small checks (straddle, partial column boxes, chunked dW2,
#    fp32), grad-checks on gpt-oss (straddling up_wgrad tiles) and deepseek, benches against the
#    defaults on deepseek, gpt-oss and mixtral.
# 2. The build for the suite: build-tsd if every tstore check passed and the tstore benches'
#    steps sum below the defaults', else build/. Its default grad-checks on two shapes.
# 3. The suite (six shapes, random + skewed routing, token sweep) on that build.
set -u
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
BUILD=build-ts OUT=$OUT/ts DEADLINE_S=$(left 230) TMA_PRESETS="gpt-oss-20b deepseek-v3" \
  TSTORE_BENCH="deepseek-v3 gpt-oss-20b mixtral-8x7b" build-ts/device_all.sh tstore > /dev/null
step_ms() { grep "^$1 " $OUT/ts/summary.txt | sed -n 's/.*step \([0-9.]*\) ms.*/\1/p'; }
S_TS=0; S_DEF=0; OK=1
grep -q "rc=[1-9]" $OUT/ts/summary.txt && OK=0
for p in deepseek-v3 gpt-oss-20b mixtral-8x7b; do
  a=$(step_ms tstore_bench_$p); b=$(step_ms default_bench_$p)
  [ -n "$a" ] && [ -n "$b" ] || { OK=0; continue; }
  S_TS=$(python3 -c "print($S_TS + $a)"); S_DEF=$(python3 -c "print($S_DEF + $b)")
done
B=build
[ "$OK" = 1 ] && python3 -c "import sys; sys.exit(0 if $S_TS < $S_DEF else 1)" && B=build-tsd
DA=tests/gpu/device_all.sh; [ "$B" = build ] || DA=$B/device_all.sh
echo "suite build: $B (tstore checks ok=$OK, tstore steps $S_TS ms, defaults $S_DEF ms)" | tee $OUT/choice.txt
BUILD=$B OUT=$OUT/a DEADLINE_S=$(left 330) PRESETS="gpt-oss-20b deepseek-v3" $DA defaults > /dev/null
BUILD=$B OUT=$OUT/c DEADLINE_S=$(left 585) SUITE_SHAPES=mixtral-8x7b,gpt-oss-20b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3,qwen3-next-80b \
  SUITE_ROUTING=random,skewed SUITE_ARGS=--sweep $DA bench > /dev/null
cat $OUT/ts/summary.txt $OUT/a/summary.txt $OUT/c/summary.txt
cat $OUT/c/suite/table.md 2>/dev/null | head -40
tar czf $OUT/all.tgz -C $OUT ts a c choice.txt && rm -rf $OUT/ts $OUT/a $OUT/c
echo "total $(( $(date +%s) - T0 )) s"

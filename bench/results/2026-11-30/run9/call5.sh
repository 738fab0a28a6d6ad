#!/usr/bin/env bash
# Session six, device call 5 (the session's last device minutes). Builds carried: build-dt/
# (branch wip/dgrad-tstore: main plus down_dgrad's TMA-staged epilogue as a candidate tile) and
# build-dtd/ (wip/dgrad-tstore-default: the same tile as down_dgrad's default).
# 1. dgradts on build-dt: small checks, grad-checks (gpt-oss, mixtral), benches of the s4 and
#    s3 tiles against the defaults on gpt-oss, mixtral, deepseek; then deepseek's grad-check.
# 2. If every check passed and the s4 benches' steps sum below the defaults': the suite on
#    build-dtd (six shapes, random routing; no sweep, no skew: the minutes left).
set -u
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
BUILD=build-dt OUT=$OUT/dt DEADLINE_S=$(left 200) DTS_PRESETS="gpt-oss-20b mixtral-8x7b" \
  build-dt/device_all.sh dgradts > /dev/null
BUILD=build-dt OUT=$OUT/dt2 DEADLINE_S=$(left 260) TILE_CHECKS="deepseek-v3:down_dgrad=128x128x64_w8x1_s4_wsp_tma_tstore" \
  build-dt/device_all.sh tilecheck > /dev/null
step_ms() { grep "^$1 " $OUT/dt/summary.txt | sed -n 's/.*step \([0-9.]*\) ms.*/\1/p'; }
S_TS=0; S_DEF=0; OK=1
cat $OUT/dt/summary.txt $OUT/dt2/summary.txt | grep -q "rc=[1-9]" && OK=0
grep -q "rc=0" $OUT/dt2/summary.txt || OK=0
for p in gpt-oss-20b mixtral-8x7b deepseek-v3; do
  a=$(step_ms dts_bench_$p); b=$(step_ms default_bench_$p)
  [ -n "$a" ] && [ -n "$b" ] || { OK=0; continue; }
  S_TS=$(python3 -c "print($S_TS + $a)"); S_DEF=$(python3 -c "print($S_DEF + $b)")
done
RUN=0
[ "$OK" = 1 ] && python3 -c "import sys; sys.exit(0 if $S_TS < $S_DEF else 1)" && RUN=1
echo "suite on build-dtd: $RUN (checks ok=$OK, s4 steps $S_TS ms, defaults $S_DEF ms)" | tee $OUT/choice.txt
if [ "$RUN" = 1 ] && [ "$(left 330)" -gt 90 ]; then
  BUILD=build-dtd OUT=$OUT/c DEADLINE_S=$(left 330) \
    SUITE_SHAPES=mixtral-8x7b,gpt-oss-20b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3,qwen3-next-80b \
    SUITE_ROUTING=random build-dtd/device_all.sh bench > /dev/null
fi
cat $OUT/dt/summary.txt $OUT/dt2/summary.txt $OUT/c/summary.txt 2>/dev/null
grep -E "\| moeblaze \|" $OUT/c/suite/table.md 2>/dev/null
tar czf $OUT/all.tgz -C $OUT dt dt2 choice.txt $( [ -d $OUT/c ] && echo c ) && rm -rf $OUT/dt $OUT/dt2 $OUT/c
echo "total $(( $(date +%s) - T0 )) s"

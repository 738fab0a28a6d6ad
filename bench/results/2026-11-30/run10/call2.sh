#!/usr/bin/env bash
# Session seven, device call 2: down_dgrad on the persistent 128x256 tile with the batched H
# loads (main a343a7b+), and the same with the producer's L2 prefetch of H (branch
# wip/dgrad-prefetch, carried as build-pf), against the default `_wg` 128x128.
# Prediction (bench/NOTES.md v0.8): mixtral down_dgrad 11.4 -> ~7-8 ms, gpt-oss 3.2 -> ~2.3.
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
OUT=$OUT/m DEADLINE_S=$(left 330) DGW_BENCH="gpt-oss-20b mixtral-8x7b deepseek-v3 qwen3-30b-a3b" $D dgradwide > /dev/null
BUILD=build-pf OUT=$OUT/pf DEADLINE_S=$(left 450) DGW_PRESETS= DGW_ONLY=1 \
  DGW_BENCH="gpt-oss-20b mixtral-8x7b deepseek-v3 qwen3-30b-a3b" $D dgradwide > /dev/null
cat $OUT/m/summary.txt $OUT/pf/summary.txt
for f in $OUT/m/logs/*bench*.log $OUT/pf/logs/*bench*.log; do
  [ -f "$f" ] && echo "$(basename $(dirname $(dirname $f)))/$(basename $f): $(grep -E '^ *down_dgrad ' $f | head -1)"
done
tar czf $OUT/all.tgz -C $OUT m pf && rm -rf $OUT/m $OUT/pf
echo "total $(( $(date +%s) - T0 )) s"

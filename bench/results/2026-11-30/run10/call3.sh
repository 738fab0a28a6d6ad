#!/usr/bin/env bash
# Session seven, device call 3: main with down_dgrad's vectorised register epilogue (the quad's
# accumulators transposed so each lane moves 8 columns, 16 bytes, per access; row_chunks.cuh)
# and the new defaults (down_dgrad 128x256 `_wsp_tma` where d >= 2560; the weight gradients'
# epilogue by T K / E). Checks first: the persistent down_dgrad's small checks and its
# grad-checks on the d = 2048 shapes (the defaults' grad-checks cover the others), the C++ GPU
# tests, the default grad-checks on all six shapes, the Python tests; then down_dgrad 128x256
# against the `_wg` 128x128 on all six shapes.
# Prediction: mixtral down_dgrad 10.6 (call 2, 4-byte batches) -> ~8 ms, deepseek 9.5 -> ~8.
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
ALL="mixtral-8x7b gpt-oss-20b olmoe-1b-7b qwen3-30b-a3b deepseek-v3 qwen3-next-80b"
OUT=$OUT/a DEADLINE_S=$(left 520) DGW_PRESETS="qwen3-30b-a3b olmoe-1b-7b qwen3-next-80b" DGW_BENCH= \
  $D dgradwide gpu defaults py > /dev/null
OUT=$OUT/b DEADLINE_S=$(left 560) DGW_PRESETS= DGW_ONLY=1 DGW_BENCH="$ALL" $D dgradwide > /dev/null
cat $OUT/a/summary.txt $OUT/b/summary.txt
mkdir -p $OUT/b/x && tar xzf $OUT/b/logs.tar.gz -C $OUT/b/x
for f in $OUT/b/x/logs/*bench*.log; do echo "$(basename $f): $(grep -E '^ *down_dgrad ' $f | head -1)"; done
rm -rf $OUT/b/x
tar czf $OUT/all.tgz -C $OUT a b && rm -rf $OUT/a $OUT/b
echo "total $(( $(date +%s) - T0 )) s"

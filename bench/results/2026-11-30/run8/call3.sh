#!/usr/bin/env bash
# Runs on branch wip/tma-gather (its device_all.sh has the tmag step), at 6c46f21.
# Session five, device call 3 (branch wip/tma-gather): the gathered rows by TMA ("_tmag", one
# box per row): small checks first (a failure or hang marks the kind failed, and then tune and
# the suite are skipped), grad-checks and benches against the defaults; then tune all six
# shapes (the "_tmag" variants are candidates; the tuner checks each against the default's
# outputs) and the suite with the winners.
set -u
T0=$(date +%s)
OUT=$OUT/a DEADLINE_S=560 TMA_PRESETS="qwen3-next-80b mixtral-8x7b" TMAG_BENCH="mixtral-8x7b deepseek-v3" \
  PRESETS="mixtral-8x7b gpt-oss-20b olmoe-1b-7b qwen3-30b-a3b deepseek-v3 qwen3-next-80b" TUNE_BUDGET=30 \
  SUITE_SHAPES=mixtral-8x7b,gpt-oss-20b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3,qwen3-next-80b SUITE_ROUTING=random,skewed \
  BENCH_NEEDS_ALL=1 tests/gpu/device_all.sh tmag tune bench > /dev/null
cat $OUT/a/summary.txt
head -50 $OUT/a/suite/table.md 2>/dev/null
echo "total $(( $(date +%s) - T0 )) s"

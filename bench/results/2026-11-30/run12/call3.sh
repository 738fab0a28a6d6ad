#!/usr/bin/env bash
# Session nine, call 3 (the session's last): every check on main as it lands (the rolled
# down_dgrad epilogue, and whatever call 2 changed in the defaults), then suite run 12: random
# and skewed routing on the six suite shapes against both baselines, the token sweep, the plot.
#   checks: the C++ GPU tests, the persistent down_dgrad's small checks (partial column tiles,
#   geglu n = 200, silu under skew, chunked hg, gelu recompute, the 128x128 tile), the default
#   grad-checks on all six presets.
# Carry ["build/bin","build/lib"].
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
OUT=$OUT/checks DEADLINE_S=$(left 300) DGW_PRESETS= DGW_BENCH= $D gpu dgradwide defaults > /dev/null
cat $OUT/checks/summary.txt
OUT=$OUT/s DEADLINE_S=$(left 560) SUITE_SHAPES=mixtral-8x7b,gpt-oss-20b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3,qwen3-next-80b \
  SUITE_ROUTING=random,skewed SUITE_ARGS=--sweep $D bench > /dev/null
cat $OUT/s/summary.txt
grep -E "^\| [a-z0-9-]+ \| random \| (16384|32768) \| moeblaze \|" $OUT/s/suite/table.md 2>/dev/null
echo "total $(( $(date +%s) - T0 )) s"

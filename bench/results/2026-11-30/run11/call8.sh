#!/usr/bin/env bash
# Session eight, call 8 (the budget's last ~4 minutes): a first look at wip/dgrad-epi-rolled
# (build-ro: the epilogues' row loop rolled; next_call.sh has the full call) against main
# (build/): A/B on gpt-oss-20b and mixtral-8x7b, then the rolled build's small checks and the
# gpt-oss grad-check. Carry ["build/bin","build/lib","build-ro"].
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
for p in gpt-oss-20b mixtral-8x7b; do
  for b in build build-ro; do
    [ -n "${DRY_RUN:-}" ] && { $b/bin/moeblaze generate --check-only --preset $p | tail -1; continue; }
    echo "$b $p: $(timeout 40 $b/bin/moeblaze bench --preset $p --no-cache 2>&1 | grep -E '^ *(down_dgrad|up_proj) |step ' | tr -s ' ' | tr '\n' ' ')"
  done
done | tee $OUT/ab.txt
OUT=$OUT/checks BUILD=build-ro DEADLINE_S=$(( 150 - ($(date +%s) - T0) )) DGW_PRESETS="gpt-oss-20b" DGW_BENCH= $D dgradwide > /dev/null
cat $OUT/checks/summary.txt
echo "total $(( $(date +%s) - T0 )) s"

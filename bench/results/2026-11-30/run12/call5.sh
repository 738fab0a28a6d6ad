#!/usr/bin/env bash
# Session nine, call 5: the user's flow on main as it lands (the new down_dgrad default on the
# d = 2048 shapes included): the Python tests (binding, autograd module, torch.compile), then
# README's main job on a GPU for two presets -- `moeblaze tune` (8 candidates a family), the
# tuned kernels' grad-check -- and the CI regression check: a baseline from tune, `regress`
# against it (must pass), and `regress --force` with a slower tile (must fail, naming it).
# Carry ["build/bin","build/lib"].
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
OUT=$OUT/a DEADLINE_S=420 PRESETS="qwen3-30b-a3b olmoe-1b-7b" TUNE_BUDGET=60 $D py tune tuned > /dev/null
cat $OUT/a/summary.txt
B=build/bin/moeblaze
if [ -z "${DRY_RUN:-}" ]; then
  $B tune --preset qwen3-30b-a3b --budget 30 --candidates 2 --quiet --baseline-out $OUT/baseline.json > $OUT/baseline_tune.log 2>&1
  echo "baseline tune rc=$?"
  timeout 60 $B regress --baseline $OUT/baseline.json > $OUT/regress.log 2>&1; echo "regress rc=$? (0 expected)"; tail -3 $OUT/regress.log
  timeout 60 $B regress --baseline $OUT/baseline.json --force down_dgrad=128x128x64_w8x1_s4_wsp_tma > $OUT/regress_forced.log 2>&1
  echo "regress --force rc=$? (1 expected)"; tail -3 $OUT/regress_forced.log
fi
echo "total $(( $(date +%s) - T0 )) s"

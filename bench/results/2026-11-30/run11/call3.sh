#!/usr/bin/env bash
# Session eight, call 3. Builds carried side by side:
#   build/      main (d492261 kernels)
#   build-ht/   wip/dgrad-h-tma (H by TMA into the stage buffers; call 2: -5..-8% down_dgrad)
#   build-st/   wip/dgrad-stagger, MB_EXPERIMENT_STAGGER=750: the odd blocks' producers start
#               ~half a tile's mainloop late (750 cycles per k step), so the blocks' epilogues
#               fall at two times instead of one (timing only; the results stay right)
#   build-hts/  wip/dgrad-h-tma-stagger: both
# Carry ["build/bin","build/lib","build-ht","build-st","build-hts"].
# Question: is the epilogue's cost (call 2: loads ~2.4 ms, stores ~1.6 ms of mixtral's 10.4)
# the DRAM burst of 132 blocks reaching their epilogues together?
# Also: why did build-ht's bench of olmoe with a persistent down_dgrad tile fail in call 2?
set -u
T0=$(date +%s)
for b in build build-ht; do
  for t in 128x128x64_w8x1_s4_wsp_tma 128x256x64_w8x1_s4_wsp_tma; do
    [ -n "${DRY_RUN:-}" ] && { $b/bin/moeblaze generate --check-only --preset olmoe-1b-7b --tile down_dgrad=$t | tail -1; continue; }
    echo "== $b olmoe $t"; timeout 60 $b/bin/moeblaze bench --preset olmoe-1b-7b --no-cache --tile down_dgrad=$t 2>&1 | grep -vE '^ *(router|index|up_|down_proj|down_wgrad|combine|gate)' | tail -12
  done
done 2>&1 | tee $OUT/olmoe.txt
bench() {  # bench BUILD PRESET: the step line and down_dgrad's row
  local b=$1 p=$2; shift 2
  [ -n "${DRY_RUN:-}" ] && { $b/bin/moeblaze generate --check-only --preset $p "$@" | tail -1; return; }
  echo "$b $p: $(timeout 60 $b/bin/moeblaze bench --preset $p --no-cache "$@" 2>&1 | grep -E '^ *down_dgrad |step |error' | tr -s ' ' | tr '\n' ' ')"
}
for p in mixtral-8x7b gpt-oss-20b deepseek-v3; do
  for b in build build-st build-ht build-hts; do bench $b $p; done
done | tee $OUT/benches.txt
echo "total $(( $(date +%s) - T0 )) s"

#!/usr/bin/env bash
# Session eight, call 2. Builds carried side by side:
#   build/     main (d492261)
#   build-ht/  branch wip/dgrad-h-tma: persistent TMA down_dgrad tiles bring the epilogue's H
#              tile in by TMA (ring steps after the tile's k steps), the epilogue reads smem
#   build-nl/  branch wip/dgrad-epi-split, MB_EXPERIMENT_EPI_NO_LOADS=1 (timing only: main's
#              epilogue without its H loads)
#   build-ns/  the same branch, MB_EXPERIMENT_EPI_NO_STORES=1 (without its dA/dB/hg stores)
# Carry ["build/bin","build/lib","build-ht","build-nl","build-ns"].
# Call 1 found the consumers' L2 prefetch of H (either lead) no faster than main, so the
# epilogue's 41 us per tile (mixtral) is not the H loads' DRAM latency alone; nl/ns split it.
set -u
D=tests/gpu/device_all.sh
T0=$(date +%s)
left() { echo $(( ${1} - ($(date +%s) - T0) )); }
P="mixtral-8x7b gpt-oss-20b deepseek-v3"
BUILD=build-ht OUT=$OUT/build-ht DEADLINE_S=$(left 200) DGW_PRESETS="gpt-oss-20b mixtral-8x7b" DGW_ONLY=1 DGW_BENCH="" \
  $D dgradwide > /dev/null
bench() {  # bench BUILD PRESET [args]: the step line and down_dgrad's row
  local b=$1 p=$2; shift 2
  [ -n "${DRY_RUN:-}" ] && { $b/bin/moeblaze generate --check-only --preset $p "$@" | tail -1; return; }
  echo "$b $p $*: $(timeout 60 $b/bin/moeblaze bench --preset $p --no-cache "$@" 2>&1 | grep -E '^ *down_dgrad |step ' | tr -s ' ' | tr '\n' ' ')"
}
{
  for p in $P; do
    for b in build build-ht build-nl build-ns; do bench $b $p; done
  done
  # d = 2048 shapes: the persistent tiles with H by TMA against their default (_wg 128x128 s3)
  for p in olmoe-1b-7b qwen3-30b-a3b qwen3-next-80b; do
    bench build $p
    bench build-ht $p --tile down_dgrad=128x128x64_w8x1_s4_wsp_tma
    bench build-ht $p --tile down_dgrad=128x256x64_w8x1_s4_wsp_tma
  done
} | tee $OUT/benches.txt
cat $OUT/build-ht/summary.txt
echo "total $(( $(date +%s) - T0 )) s"

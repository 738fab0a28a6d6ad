#!/usr/bin/env bash
# Session eight, call 5. Builds: build/ (main), build-ht/ (wip/dgrad-h-tma), build-ne/ (the
# mainloop alone, timing only). Carry ["build/bin","build/lib","build-ht","build-ne"].
# 1. build-ht's illegal address (olmoe, any T; not mixtral/gpt-oss/deepseek): grad-checks that
#    move one parameter at a time from a failing olmoe-like shape towards the passing ones, then
#    compute-sanitizer (memcheck, then synccheck) on the failing base.
# 2. ncu, one down_dgrad launch on gpt-oss-20b per build: DRAM bytes and the L2 hit rate, to
#    see whether the epilogue's cost is its own bytes or the mainloop's extra misses.
set -u
export PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s)
HT="--tile down_dgrad=128x256x64_w8x1_s4_wsp_tma"
run() {  # run NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  if [ -n "${DRY_RUN:-}" ]; then echo "$name: dry"; return; fi
  echo "== $name: $(timeout $limit "$@" 2>&1 | grep -E 'PASS|FAIL|error|ERROR|Invalid|invalid|at 0x|by thread|Address|kernel|mb_' | head -12 | tr -s ' ')"
}
B="build-ht/bin/moeblaze grad-check -T 4096"
{
  run base 40 $B -E 64 -K 8 -d 2048 -n 1024 --router softmax $HT
  run router_none 40 $B -E 64 -K 8 -d 2048 -n 1024 --router none $HT
  run d4096 40 $B -E 64 -K 8 -d 4096 -n 1024 --router softmax $HT
  run d1024 40 $B -E 64 -K 8 -d 1024 -n 1024 --router softmax $HT
  run n2048 40 $B -E 64 -K 8 -d 2048 -n 2048 --router softmax $HT
  run n512 40 $B -E 64 -K 8 -d 2048 -n 512 --router softmax $HT
  run E8K2 40 $B -E 8 -K 2 -d 2048 -n 1024 --router softmax $HT
  run E256 40 $B -E 256 -K 8 -d 2048 -n 1024 --router softmax $HT
  run K2 40 $B -E 64 -K 2 -d 2048 -n 1024 --router softmax $HT
  run T512 40 build-ht/bin/moeblaze grad-check -T 512 -E 64 -K 8 -d 2048 -n 1024 --router softmax $HT
  run main_base 40 build/bin/moeblaze grad-check -T 4096 -E 64 -K 8 -d 2048 -n 1024 --router softmax $HT
  run memcheck 120 compute-sanitizer --tool memcheck --print-limit 4 $B -E 64 -K 8 -d 2048 -n 1024 --router softmax $HT
  run synccheck 120 compute-sanitizer --tool synccheck --print-limit 4 $B -E 64 -K 8 -d 2048 -n 1024 --router softmax $HT
} | tee $OUT/debug.txt
M=dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum
for b in build build-ne build-ht; do
  [ -n "${DRY_RUN:-}" ] && { echo "ncu $b: dry"; continue; }
  echo "== ncu $b"; timeout 90 ncu --metrics $M -k regex:down_dgrad -c 1 $b/bin/moeblaze bench --preset gpt-oss-20b --no-cache 2>&1 | grep -E 'dram__|lts__|gpu__time|==ERR|rror' | tr -s ' '
done | tee $OUT/ncu.txt
echo "total $(( $(date +%s) - T0 )) s"

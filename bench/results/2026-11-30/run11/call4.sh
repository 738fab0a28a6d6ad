#!/usr/bin/env bash
# Session eight, call 4. Builds carried side by side:
#   build/       main
#   build-cs/    wip/dgrad-cs: main's persistent down_dgrad epilogue with evict-first loads and
#                stores (ld/st.global.cs)
#   build-ht/    wip/dgrad-h-tma (H by TMA)
#   build-htcs/  wip/dgrad-h-tma-cs: H by TMA under an L2 evict-first policy, st.global.cs
# Carry ["build/bin","build/lib","build-cs","build-ht","build-htcs"].
# Hypothesis (after calls 1-3: neither an L2 prefetch, nor H by TMA, nor staggered blocks
# recover the epilogue's cost): the epilogue's 42 MB per wave of once-touched bytes evict the
# mainloop's reused dy rows (32 MiB per mixtral expert) and W2 tiles from the 50 MiB L2, so
# the cost is the next mainloops' misses. Evict-first hints should then recover much of it.
# Also: build-ht's illegal address on the d = 2048 shapes (call 3): bracket it by T and shape,
# then compute-sanitizer on the smallest failing case.
set -u
export PATH=/usr/local/cuda/bin:$PATH
T0=$(date +%s)
HT128="--tile down_dgrad=128x128x64_w8x1_s4_wsp_tma"
HT256="--tile down_dgrad=128x256x64_w8x1_s4_wsp_tma"
run() {  # run NAME TIMEOUT CMD...: the last lines of the output
  local name=$1 limit=$2; shift 2
  if [ -n "${DRY_RUN:-}" ]; then echo "$name: dry"; return; fi
  echo "== $name ($(date +%s)):"; timeout $limit "$@" 2>&1 | grep -vE '^ *(router|index|up_|down_proj|down_wgrad|combine|gate|kernel) ' | tail -6
}
{
  run olmoe_grad_ht256 90 build-ht/bin/moeblaze grad-check --preset olmoe-1b-7b $HT256
  run olmoe_T16k_ht256 40 build-ht/bin/moeblaze bench --preset olmoe-1b-7b -T 16384 --no-cache $HT256
  run olmoe_T4k_ht256 40 build-ht/bin/moeblaze bench --preset olmoe-1b-7b -T 4096 --no-cache $HT256
  run mixtral_T32k_ht 60 build-ht/bin/moeblaze bench --preset mixtral-8x7b -T 32768 --no-cache
  run sanitizer_olmoe_T4k 150 compute-sanitizer --tool memcheck --print-limit 8 build-ht/bin/moeblaze bench --preset olmoe-1b-7b -T 4096 --no-cache $HT128
} | tee $OUT/debug.txt
bench() {  # bench BUILD PRESET: the step line and down_dgrad's row
  local b=$1 p=$2; shift 2
  [ -n "${DRY_RUN:-}" ] && { $b/bin/moeblaze generate --check-only --preset $p "$@" | tail -1; return; }
  echo "$b $p: $(timeout 60 $b/bin/moeblaze bench --preset $p --no-cache "$@" 2>&1 | grep -E '^ *down_dgrad |step |error' | tr -s ' ' | tr '\n' ' ')"
}
{
  for p in mixtral-8x7b gpt-oss-20b; do
    for b in build build-cs build-ht build-htcs; do bench $b $p; done
  done
  for b in build-cs build-htcs; do bench $b deepseek-v3; done
} | tee $OUT/benches.txt
echo "total $(( $(date +%s) - T0 )) s"

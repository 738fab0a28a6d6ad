#!/usr/bin/env bash
# One device call that does a lot (build/bin and build/lib carried): the C++ GPU tests, the
# wgmma checks, the Python GPU tests and the suite bench on the shapes in $SUITE_SHAPES.
# Every log goes into $OUT/logs.tar.gz (the device tool returns at most 8 files); a summary
# line per step goes to stdout and $OUT/summary.txt.
# Usage: tests/gpu/device_all.sh [steps...]   steps: gpu wgmma ws wsp tma tmaw tmaall dgradstaged bn192 tstore dgradwide defaults import tune tuned mem py pysuite profile tilecheck bench (default: gpu ws py bench)
set -u
OUT=${OUT:-device-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
# BUILD: the build folder to run (default build; another carried one, e.g. a branch's, compares
# kernels of two builds in one call on one GPU)
BUILD=${BUILD:-build}
export MOEBLAZE_LIBRARY=$PWD/$BUILD/lib/libmoeblaze_c.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
export MOEBLAZE_CACHE=${MOEBLAZE_CACHE:-/tmp/moeblaze-cache.db}
BIN=$BUILD/bin/moeblaze
steps=${*:-gpu ws py bench}
[ -n "${DRY_RUN:-}" ] || nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$LOG/gpu.txt"
# DEADLINE_S: seconds from now after which no step runs on (each step's timeout is cut to
# fit), so a device call ends inside its limit with every log packed.
T_END=$(( $(date +%s) + ${DEADLINE_S:-3600} ))
pack() { tar czf "$OUT/logs.tar.gz" -C "$OUT" logs; }
# DRY_RUN=1 (no GPU needed): the checks and benches of the chosen steps become
# `moeblaze generate --check-only` on the same shape and tiles (every tile legal for its
# layer?) and everything else is skipped: run before spending a device call on new steps.
dry_command() {  # prints the check-only command for a moeblaze check or bench, nothing otherwise
  [ "$1" = "$BIN" ] || return 0
  case ${2:-} in forward-check|grad-check|bench) ;; *) return 0 ;; esac
  shift 2
  local out="$BIN generate --check-only"
  while [ $# -gt 0 ]; do
    case $1 in
      -E|-K|-d|-n|--activation|--router|--preset|--tile|--route-scale) out="$out $1 $2"; shift 2 ;;
      --renormalize) out="$out $1"; shift ;;
      -T|--mode|--routing|--steps|--samples|--seed|--db) shift 2 ;;
      *) shift ;;  # flags: --no-cache, --tuned, --accumulate-fp32, --json
    esac
  done
  echo "$out"
}
step() {  # step NAME TIMEOUT CMD...
  local name=$1 limit=$2; shift 2
  if [ -n "${DRY_RUN:-}" ]; then
    local dry
    dry=$(dry_command "$@")
    if [ -z "$dry" ]; then echo "$name: dry run, skipped" | tee -a "$OUT/summary.txt"; LAST_RC=0; return; fi
    set -- $dry
  fi
  local t0=$(date +%s)
  local left=$(( T_END - t0 ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then echo "$name skipped: deadline" | tee -a "$OUT/summary.txt"; return; fi
  timeout "$limit" "$@" > "$LOG/$name.log" 2>&1
  local rc=$?
  printf '%-34s rc=%-3s %4ss | %s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" \
    "$(grep -E '^(PASS|FAIL)|step .* ms|passed|failed|every tile legal' "$LOG/$name.log" | tail -n 3 | tr '\n' ' ' | cut -c1-220)" \
    | tee -a "$OUT/summary.txt"
  [ $rc -eq 0 ] || { tail -n 15 "$LOG/$name.log"; STEP_FAILS=$((STEP_FAILS + 1)); }
  LAST_RC=$rc
  pack
}
STEP_FAILS=0      # steps that exited non-zero so far (a step kind's checks compare it before/after)
FAILED_BLOCKS=""  # tile kinds whose first check failed: their other checks and tune are skipped
for s in $steps; do case $s in
gpu) step gpu_tests 240 $BUILD/bin/moeblaze_gpu_tests ;;
wgmma|ws|wsp)  # the wgmma tiles of every GEMM family: "_wg" (shared pipeline), "_ws" (warp-specialised),
  # "_wsp" (persistent warp-specialised; expert GEMMs only, the router GEMMs run "_ws")
  X=$(case $s in ws) echo _ws;; wsp) echo _wsp;; *) echo _wg;; esac)
  R=$([ "$s" = wsp ] && echo _ws || echo "$X")
  WGF="--tile up_proj=128x128x64_w8x1_s3$X --tile down_proj=128x256x64_w8x1_s3$X --tile router_logits=128x64x64_w8x1_s4$R"
  WG="$WGF"
  BW=$([ "$s" = wsp ] && echo 256 || echo 128)
  for f in down_dgrad down_wgrad up_wgrad up_dgrad; do WG="$WG --tile $f=128x${BW}x64_w8x1_s4$X"; done
  for f in router_dgrad router_wgrad; do WG="$WG --tile $f=128x128x64_w8x1_s4$R"; done
  # A tile kind that fails (or hangs: 60 s) its first, smallest check gets no more device time.
  step ${s}_small_fwd 60 $BIN forward-check -E 8 -K 2 -d 256 -n 128 -T 300 $WGF
  if [ "$LAST_RC" -ne 0 ]; then FAILED_BLOCKS="$FAILED_BLOCKS $s"; continue; fi
  step ${s}_small_grad 120 $BIN grad-check -E 8 -K 2 -d 256 -n 128 -T 300 $WG
  step ${s}_small_skew 120 $BIN grad-check -E 64 -K 8 -d 256 -n 192 -T 1000 --router none --routing skewed $WG
  step ${s}_small_recompute 120 $BIN grad-check -E 60 -K 4 -d 136 -n 200 -T 777 --mode recompute --activation geglu $WG
  for p in ${WG_PRESETS-qwen3-30b-a3b}; do
    step "${s}_grad_$p" 200 $BIN grad-check --preset "$p" $WG
    step "${s}_bench_$p" 200 $BIN bench --preset "$p" --no-cache $WG
  done ;;
tma)  # TMA weight tiles (up_proj, down_proj): small checks, then grad-check and bench on
  # $TMA_PRESETS with the TMA tiles and, for comparison, the same tiles without TMA
  TT="--tile up_proj=128x128x64_w8x1_s4_ws_tma --tile down_proj=128x256x64_w8x1_s4_ws_tma"
  TP="--tile up_proj=128x128x64_w8x1_s4_wsp_tma --tile down_proj=128x256x64_w8x1_s4_wsp_tma"
  TN="--tile up_proj=128x128x64_w8x1_s4_ws --tile down_proj=128x256x64_w8x1_s4_ws"
  step tma_small_fwd 60 $BIN forward-check -E 8 -K 2 -d 256 -n 128 -T 300 $TT
  if [ "$LAST_RC" -ne 0 ]; then FAILED_BLOCKS="$FAILED_BLOCKS tma"; continue; fi
  step tma_small_recompute 120 $BIN grad-check -E 60 -K 4 -d 136 -n 200 -T 777 --mode recompute --activation geglu $TT
  step tmap_small_grad 120 $BIN grad-check -E 64 -K 8 -d 256 -n 192 -T 1000 --router none --routing skewed --activation silu $TP
  for p in ${TMA_PRESETS-gpt-oss-20b mixtral-8x7b}; do
    step "tma_grad_$p" 200 $BIN grad-check --preset "$p" $TT
    step "tmap_grad_$p" 200 $BIN grad-check --preset "$p" $TP
    step "tma_bench_$p" 200 $BIN bench --preset "$p" --no-cache $TT
    step "tmap_bench_$p" 200 $BIN bench --preset "$p" --no-cache $TP
    step "notma_bench_$p" 200 $BIN bench --preset "$p" --no-cache $TN
  done ;;
tmaw)  # TMA for dH (up_wgrad) and hg (down_wgrad): small checks (partial last stages, chunked hg),
  # grad-checks on $TMA_PRESETS, benches against the same tiles without TMA on $TMAW_BENCH
  TW="--tile up_wgrad=128x256x64_w8x1_s4_ws_tma --tile down_wgrad=128x256x64_w8x1_s4_ws_tma"
  TWP="--tile up_wgrad=128x256x64_w8x1_s4_wsp_tma --tile down_wgrad=128x256x64_w8x1_s4_wsp_tma"
  TW0="--tile up_wgrad=128x256x64_w8x1_s4_ws --tile down_wgrad=128x256x64_w8x1_s4_ws"
  step tmaw_small_grad 60 $BIN grad-check -E 60 -K 4 -d 136 -n 200 -T 777 --activation geglu $TW
  if [ "$LAST_RC" -ne 0 ]; then FAILED_BLOCKS="$FAILED_BLOCKS tmaw"; continue; fi
  step tmawp_small_skew 60 $BIN grad-check -E 64 -K 8 -d 256 -n 192 -T 1000 --router none --routing skewed --activation silu $TWP
  for p in ${TMA_PRESETS-qwen3-next-80b mixtral-8x7b}; do step "tmaw_grad_$p" 200 $BIN grad-check --preset "$p" $TW; done
  for p in ${TMAW_BENCH-mixtral-8x7b deepseek-v3}; do
    step "tmaw_bench_$p" 100 $BIN bench --preset "$p" --no-cache $TW
    step "tmawp_bench_$p" 100 $BIN bench --preset "$p" --no-cache $TWP
    step "notmaw_bench_$p" 100 $BIN bench --preset "$p" --no-cache $TW0
  done ;;
dgradstaged)  # down_dgrad's epilogue through shared memory (one-tile
  # wgmma blocks): small checks (gated, non-gated, skewed, column chunks), grad-checks, benches
  # of the defaults (compare down_dgrad with main's: run7 call4 / call5 logs)
  step staged_small_grad 60 $BIN grad-check -E 8 -K 2 -d 256 -n 128 -T 300
  if [ "$LAST_RC" -ne 0 ]; then FAILED_BLOCKS="$FAILED_BLOCKS dgradstaged"; continue; fi
  step staged_small_gelu 60 $BIN grad-check -E 64 -K 8 -d 256 -n 192 -T 1000 --router none --routing skewed --activation gelu
  step staged_small_chunked 60 $BIN grad-check -E 8 -K 2 -d 128 -n 1000 -T 1000 --tile down_dgrad=128x256x64_w8x1_s4_ws
  for p in ${STAGED_PRESETS-mixtral-8x7b qwen3-next-80b}; do step "staged_grad_$p" 200 $BIN grad-check --preset "$p"; done
  for p in ${STAGED_BENCH-mixtral-8x7b deepseek-v3 qwen3-30b-a3b}; do
    step "staged_bench_$p" 100 $BIN bench --preset "$p" --no-cache
    step "staged_ws256_bench_$p" 100 $BIN bench --preset "$p" --no-cache --tile down_dgrad=128x256x64_w8x1_s4_ws
  done ;;
tmaall)  # TMA for down_proj's h (default tile), up_dgrad's dH and W1/W3,
  # down_dgrad's W2; small checks, grad-checks on $TMA_PRESETS, benches against the same tiles
  # without TMA on $TMAW_BENCH
  TD="--tile up_dgrad=128x256x64_w8x1_s4_ws_tma --tile down_dgrad=128x256x64_w8x1_s4_ws_tma"
  TDP="--tile up_dgrad=128x256x64_w8x1_s4_wsp_tma --tile down_dgrad=128x256x64_w8x1_s4_wsp_tma"
  TD0="--tile up_dgrad=128x256x64_w8x1_s4_ws --tile down_dgrad=128x256x64_w8x1_s4_ws"
  step tmaall_small_fwd 60 $BIN forward-check -E 8 -K 2 -d 256 -n 128 -T 300
  if [ "$LAST_RC" -ne 0 ]; then FAILED_BLOCKS="$FAILED_BLOCKS tmaall"; continue; fi
  step tmaall_small_grad 60 $BIN grad-check -E 60 -K 4 -d 192 -n 256 -T 777 --activation geglu $TD
  step tmaallp_small_skew 60 $BIN grad-check -E 64 -K 8 -d 256 -n 192 -T 1000 --router none --routing skewed --activation silu $TDP
  for p in ${TMA_PRESETS-qwen3-next-80b mixtral-8x7b}; do step "tmaall_grad_$p" 200 $BIN grad-check --preset "$p" $TD; done
  for p in ${TMAW_BENCH-mixtral-8x7b deepseek-v3}; do
    step "tmaall_bench_$p" 100 $BIN bench --preset "$p" --no-cache $TD
    step "tmaallp_bench_$p" 100 $BIN bench --preset "$p" --no-cache $TDP
    step "notmaall_bench_$p" 100 $BIN bench --preset "$p" --no-cache $TD0
  done ;;
bn192)  # 192-column tiles (m64n192k16) where 256 leaves a part-empty last column of tiles
  # (gpt-oss-20b: 2880 = 15 x 192): small checks (exact and ragged columns), the gpt-oss
  # grad-check and bench against the defaults
  T192="--tile down_proj=128x192x64_w8x1_s4_wsp_tma --tile up_dgrad=128x192x64_w8x1_s4_ws_tma"
  T192="$T192 --tile up_wgrad=128x192x64_w8x1_s4_wsp_tma"
  FAILS0=$STEP_FAILS
  step bn192_small_grad 60 $BIN grad-check -E 8 -K 2 -d 384 -n 192 -T 300 $T192
  if [ "$LAST_RC" -ne 0 ]; then FAILED_BLOCKS="$FAILED_BLOCKS bn192"; continue; fi
  step bn192_small_ragged 60 $BIN grad-check -E 60 -K 4 -d 448 -n 320 -T 777 --activation geglu $T192
  step bn192_small_skew 60 $BIN grad-check -E 64 -K 8 -d 576 -n 192 -T 1000 --router none --routing skewed $T192
  if [ "$STEP_FAILS" -ne "$FAILS0" ]; then FAILED_BLOCKS="$FAILED_BLOCKS bn192"; continue; fi
  step bn192_grad_gpt-oss-20b 200 $BIN grad-check --preset gpt-oss-20b $T192
  step bn192_bench_gpt-oss-20b 100 $BIN bench --preset gpt-oss-20b --no-cache $T192
  step default_bench_gpt-oss-20b 100 $BIN bench --preset gpt-oss-20b --no-cache ;;
tstore)  # the weight gradients' TMA-store epilogue ("_tstore"): small checks (a hang fails at
  # 60 s; n = 200 makes up_wgrad tiles straddle dW1 | dW3 and d = 200 clips rows and columns;
  # the chunked case stores dW2 column chunks), grad-checks on $TMA_PRESETS (gpt-oss: 2880 =
  # 22.5 tiles of 128), benches against the defaults on $TSTORE_BENCH.
  TS="--tile up_wgrad=128x256x64_w8x1_s3_wsp_tma_tstore --tile down_wgrad=128x256x64_w8x1_s3_wsp_tma_tstore"
  TS1="--tile up_wgrad=128x128x64_w8x1_s4_wsp_tma_tstore --tile down_wgrad=128x256x64_w8x1_s3_ws_tstore"
  FAILS0=$STEP_FAILS
  step tstore_small_grad 60 $BIN grad-check -E 8 -K 2 -d 256 -n 128 -T 300 $TS
  if [ "$LAST_RC" -ne 0 ]; then FAILED_BLOCKS="$FAILED_BLOCKS tstore"; continue; fi
  step tstore_small_cols 60 $BIN grad-check -E 60 -K 4 -d 200 -n 256 -T 777 $TS  # partial column boxes, no straddle
  step tstore_small_straddle 60 $BIN grad-check -E 60 -K 4 -d 200 -n 200 -T 777 --activation geglu $TS
  step tstore1_small_straddle 60 $BIN grad-check -E 60 -K 4 -d 200 -n 200 -T 777 --mode recompute $TS1
  step tstore_small_skew 60 $BIN grad-check -E 64 -K 8 -d 256 -n 192 -T 1000 --router none --routing skewed --activation silu $TS
  step tstore_small_chunked 60 $BIN grad-check -E 8 -K 2 -d 128 -n 1000 -T 1000 --routing skewed --router none $TS
  step tstore_small_fp32 60 $BIN grad-check -E 8 -K 2 -d 256 -n 128 -T 300 --accumulate-fp32 $TS
  if [ "$STEP_FAILS" -ne "$FAILS0" ]; then FAILED_BLOCKS="$FAILED_BLOCKS tstore"; continue; fi
  for p in ${TMA_PRESETS-gpt-oss-20b mixtral-8x7b}; do step "tstore_grad_$p" 200 $BIN grad-check --preset "$p" $TS; done
  for p in ${TSTORE_BENCH-deepseek-v3 mixtral-8x7b}; do
    step "tstore_bench_$p" 100 $BIN bench --preset "$p" --no-cache $TS
    step "tstore1_bench_$p" 100 $BIN bench --preset "$p" --no-cache $TS1
    step "default_bench_$p" 100 $BIN bench --preset "$p" --no-cache
  done ;;
dgradwide)  # down_dgrad on the persistent warp-specialised tile, whose epilogue reads H straight
  # from global memory, now in batches (v0.8): 128x256 at 4 and 3 stages and 128x128 at 4. Small
  # checks (a hang fails at 60 s; a partial column tile, n = 200 with geglu, silu (G = 1) under
  # skewed routing, the chunked hg columns, recompute), grad-checks on $DGW_PRESETS, benches
  # against the defaults on $DGW_BENCH.
  DW="--tile down_dgrad=128x256x64_w8x1_s4_wsp_tma"
  DW3="--tile down_dgrad=128x256x64_w8x1_s3_wsp_tma"
  DW128="--tile down_dgrad=128x128x64_w8x1_s4_wsp_tma"
  FAILS0=$STEP_FAILS
  step dgw_small_grad 60 $BIN grad-check -E 8 -K 2 -d 256 -n 128 -T 300 $DW
  if [ "$LAST_RC" -ne 0 ]; then FAILED_BLOCKS="$FAILED_BLOCKS dgradwide"; continue; fi
  step dgw_small_ragged 60 $BIN grad-check -E 60 -K 4 -d 192 -n 200 -T 777 --activation geglu $DW
  step dgw_small_skew 60 $BIN grad-check -E 64 -K 8 -d 256 -n 192 -T 1000 --router none --routing skewed --activation silu $DW
  step dgw_small_chunked 60 $BIN grad-check -E 8 -K 2 -d 128 -n 1000 -T 1000 --routing skewed --router none $DW
  step dgw_small_recompute 60 $BIN grad-check -E 6 -K 2 -d 192 -n 520 -T 777 --mode recompute --activation gelu $DW
  step dgw128_small_ragged 60 $BIN grad-check -E 60 -K 4 -d 192 -n 200 -T 777 $DW128
  if [ "$STEP_FAILS" -ne "$FAILS0" ]; then FAILED_BLOCKS="$FAILED_BLOCKS dgradwide"; continue; fi
  for p in ${DGW_PRESETS-gpt-oss-20b mixtral-8x7b}; do step "dgw_grad_$p" 200 $BIN grad-check --preset "$p" $DW; done
  DWG="--tile down_dgrad=128x128x64_w8x1_s3_wg"  # the two-blocks-per-SM tile (the default before v0.8)
  for p in ${DGW_BENCH-gpt-oss-20b mixtral-8x7b deepseek-v3}; do
    step "dgw_bench_$p" 100 $BIN bench --preset "$p" --no-cache $DW
    step "dgwg_bench_$p" 100 $BIN bench --preset "$p" --no-cache $DWG
    [ -n "${DGW_ONLY:-}" ] && continue
    step "dgw3_bench_$p" 100 $BIN bench --preset "$p" --no-cache $DW3
    step "dgw128_bench_$p" 100 $BIN bench --preset "$p" --no-cache $DW128
    step "default_bench_$p" 100 $BIN bench --preset "$p" --no-cache
  done ;;
defaults)  # grad-check every suite preset with the default tiles (n > d shapes first at a small
  # size: the forward's slot chunks and the down backward's column chunks)
  step chunked_small_grad 120 $BIN grad-check -E 8 -K 2 -d 128 -n 1000 -T 1000 --routing skewed --router none
  step chunked_small_recompute 120 $BIN grad-check -E 6 -K 2 -d 192 -n 520 -T 777 --mode recompute --activation gelu
  for p in ${PRESETS:-mixtral-8x7b gpt-oss-20b olmoe-1b-7b qwen3-30b-a3b deepseek-v3 qwen3-next-80b}; do
    step "default_grad_$p" 200 $BIN grad-check --preset "$p"
  done ;;
tune)  # tune the presets into $MOEBLAZE_CACHE (the suite and the CLI bench then load the winners)
  if [ -n "$FAILED_BLOCKS" ]; then echo "tune skipped: tile kinds failed:$FAILED_BLOCKS" | tee -a "$OUT/summary.txt"; continue; fi
  for p in ${PRESETS:-qwen3-30b-a3b}; do
    step "tune_$p" 300 $BIN tune --preset "$p" --budget "${TUNE_BUDGET:-75}" --candidates "${TUNE_CANDIDATES:-8}"
  done
  # The tuned cache comes back (carry it as build/tuned.db and set MOEBLAZE_CACHE to reuse it).
  # Files come back up to 16 MiB: drop unreferenced binaries (the losers) first.
  if [ -z "${DRY_RUN:-}" ]; then
    $BIN cache gc --max-mb 14 > "$LOG/cache_gc.log" 2>&1
    $BIN cache export "$OUT/tuned.db" >> "$LOG/cache_gc.log" 2>&1
  fi ;;
import)  # take the winners of an earlier call's tune (build/tuned.db, carried) into $MOEBLAZE_CACHE
  step cache_import 60 $BIN cache import build/tuned.db ;;
tuned)  # grad-check the tuned kernels of the presets (after tune)
  for p in ${PRESETS:-qwen3-30b-a3b}; do step "tuned_grad_$p" 200 $BIN grad-check --preset "$p" --tuned; done ;;
mem) step memory_probe 120 python3 bench/memory_probe.py --shapes "${MEM_SHAPES:-mixtral-8x7b}" ;;
py) step py_tests 400 python3 -m pytest -x -q python/tests ;;
pysuite) step py_suite_tests 500 env MOEBLAZE_SUITE=1 python3 -m pytest -x -q python/tests/test_torch_gpu.py -k "module_matches" ;;
profile)  # Nsight Compute on the GEMM kernels of $PROFILE_PRESET (one launch each), text report
  # PROFILE_FAMILIES (regex alternatives), PROFILE_SECTIONS (ncu section names) narrow it.
  PF=${PROFILE_FAMILIES:-up_proj|down_proj|up_dgrad|up_wgrad|down_dgrad|down_wgrad}
  SECTIONS=""
  for x in ${PROFILE_SECTIONS:-SpeedOfLight MemoryWorkloadAnalysis ComputeWorkloadAnalysis WarpStateStats SchedulerStats Occupancy LaunchStats}; do
    SECTIONS="$SECTIONS --section $x"
  done
  step "profile_${PROFILE_PRESET:-mixtral-8x7b}" 300 ncu --target-processes all \
    -k "regex:mb_($PF)_" --launch-count "$(echo "$PF" | tr '|' '\n' | wc -l)" $SECTIONS \
    $BIN bench --preset "${PROFILE_PRESET:-mixtral-8x7b}" --no-cache --steps 10 ${PROFILE_ARGS:-} ;;
tilecheck)  # grad-check single tiles: TILE_CHECKS="preset:family=tile ..."
  for c in ${TILE_CHECKS:-}; do
    step "tilecheck_${c%%:*}_${c#*:}" 200 $BIN grad-check --preset "${c%%:*}" --tile "${c#*:}"
  done ;;
bench) step suite 500 python3 bench/suite.py --shapes "${SUITE_SHAPES:-qwen3-30b-a3b}" \
         --routing "${SUITE_ROUTING:-random}" --out "$OUT/suite" ${SUITE_ARGS:-} ;;
esac; done
pack && rm -rf "$LOG"

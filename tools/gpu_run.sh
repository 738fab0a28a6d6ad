#!/usr/bin/env bash
# The GPU runner: moeblaze's checks, tuning, suite and profiles on a GPU machine in one call,
# with a build made elsewhere. Its usage text (--help) documents every step and variable.
set -u

usage() {
  cat <<'EOF'
Usage: tools/gpu_run.sh [--dry-run | --precompile DB] [STEP...]
       tools/gpu_run.sh --list | --help

Runs moeblaze's GPU work on a machine with an NVIDIA GPU, from the repository root, with a
build folder made elsewhere (its bin/ and lib/ are all it needs; nothing is compiled here).
Each command's output goes to $MOEBLAZE_DEV_OUT/logs/NAME.log, packed into logs.tar.gz after
every command; one summary line per command goes to stdout and $MOEBLAZE_DEV_OUT/summary.txt.
Exit status: 0 when every command ended as expected, 1 otherwise.

Steps (default: gpu kinds defaults py):
  gpu       the C++ GPU tests (BUILD/bin/moeblaze_gpu_tests: the layer cases, the tile table's fast rows)
  kinds     grad-check every tile kind (_wgmma, _ws, _persist, _pingpong, _cluster2x1, TMA loads,
            _tmastore (weight gradients, per-slot outputs, _tmastore64), _directarrive, 192-wide
            tiles, the 96/160/208/224-wide gate_up and down_proj tiles, the 128x192 ping-pong
            tiles (alone and in clusters), _altorder,
            the persistent down_dgrad; docs/design.md,
            "Glossary") on small shapes chosen for partial tiles, skewed
            routing, gated and plain activations, recompute, the wide-h chunks and fp32
            accumulation; a kind whose first check fails gets no more; also each kind on the
            presets of MOEBLAZE_DEV_KIND_PRESETS
  defaults  grad-check the default tiles: the small wide-h shapes, then every preset of
            MOEBLAZE_DEV_PRESETS in save-h, in recompute, and with skewed caller routing
  tune      `moeblaze tune` each preset of MOEBLAZE_DEV_PRESETS into the cache, then export the
            cache (unreferenced binaries dropped) to $MOEBLAZE_DEV_OUT/tuned.db.xz
  import    take the rows of MOEBLAZE_DEV_IMPORT (an earlier tune's tuned.db or tuned.db.xz) into the cache
  tuned     grad-check the cache's tuned kernels of each preset (after tune or import)
  regress   tune the first preset with --baseline-out, then `moeblaze regress` against that
            baseline (must pass) and with a much slower gate_up tile forced (must fail)
  tiles     grad-check and bench single tiles, MOEBLAZE_DEV_TILES, each beside the default
  py        the Python package's tests (python/tests)
  pysuite   the PyTorch module against the reference on the six suite shapes
  mem       bench/memory_probe.py on MOEBLAZE_DEV_MEM_SHAPES
  bench     the suite against the PyTorch baselines (bench/suite.py)
  profile   Nsight Compute on one preset's GEMM kernels, one launch each (reports under OUT/ncu/)
  peerprofile  Nsight Compute on one training step of SonicMoE and of moeblaze on the same
            preset and inputs (bench/ncu_step.py: warm-up steps, then one profiled step), the
            GEMM kernels of each with the profile step's sections: the peer's kernels beside
            moeblaze's, stall for stall (SonicMoE's QuACK kernels restored first when
            MOEBLAZE_QUACK_RESTORE is set)
  all       every step above, in this order

Options:
  --dry-run   no GPU needed: every check and bench becomes `moeblaze generate --check-only`
              on the same shape and tiles (is every tile legal for its layer?) and every other
              command is skipped. CTest `device_steps` runs `--dry-run all`.
  --list      print the step names
  --precompile DB
              no GPU needed: as --dry-run, but every check and bench becomes `moeblaze generate
              --db DB` (the kernels compiled into DB). Carry DB (xz packs it ~16:1) and run the
              same steps with MOEBLAZE_CACHE=DB on the GPU machine: the checks take their
              binaries from it (grad-check --db) instead of compiling them there.
  -h, --help  this text

Environment (all optional):
  MOEBLAZE_DEV_OUT               output folder (default: device-out)
  MOEBLAZE_DEV_BUILD             build folder to run (default: build); a second one carried
                                 beside it runs another build's kernels on the same GPU
  MOEBLAZE_DEV_DEADLINE_S        seconds from the start after which no command starts; each
                                 command's time limit is cut to fit (default: 3600)
  MOEBLAZE_DEV_DRY_RUN           1: as --dry-run
  MOEBLAZE_DEV_PRESETS           presets of defaults, tune, tuned and regress, space-separated
                                 (default: qwen3-30b-a3b; `BUILD/bin/moeblaze presets` lists them)
  MOEBLAZE_DEV_KINDS             the kinds step's tile kinds, space-separated (default: all of them)
  MOEBLAZE_DEV_KIND_PRESETS      presets on which kinds also grad-checks every kind (default: none)
  MOEBLAZE_DEV_TUNE_BUDGET       seconds of tuning per preset (default: 75)
  MOEBLAZE_DEV_TUNE_CANDIDATES   candidates per GEMM family (default: 8)
  MOEBLAZE_DEV_IMPORT            cache file of the import step, .xz unpacked first (default: BUILD/tuned.db.xz)
  MOEBLAZE_DEV_TILES             the tiles step's checks: "PRESET:FAMILY=TILE ..." (default: none)
  MOEBLAZE_DEV_SUITE_SHAPES      the bench step's shapes, comma-separated (default: qwen3-30b-a3b)
  MOEBLAZE_DEV_SUITE_ROUTING     random, skewed, or both comma-separated (default: random)
  MOEBLAZE_DEV_SUITE_ARGS        more bench/suite.py arguments, e.g. --sweep (default: none)
  MOEBLAZE_DEV_MEM_SHAPES        the mem step's shapes, comma-separated (default: mixtral-8x7b)
  MOEBLAZE_DEV_PROFILE_PRESET    the profile step's preset (default: mixtral-8x7b)
  MOEBLAZE_DEV_PROFILE_FAMILIES  families to profile, |-separated
                                 (default: gate_up|down_proj|gate_up_dgrad|gate_up_wgrad|down_dgrad|down_wgrad)
  MOEBLAZE_DEV_PROFILE_SECTIONS  ncu sections, space-separated (default: SpeedOfLight
                                 MemoryWorkloadAnalysis ComputeWorkloadAnalysis WarpStateStats
                                 SchedulerStats Occupancy LaunchStats)
  MOEBLAZE_DEV_PROFILE_ARGS      more arguments of the profiled `moeblaze bench`, e.g. --tile
  MOEBLAZE_DEV_PEER_PROFILE_IMPLS  peerprofile's implementations (default: sonicmoe moeblaze)
  MOEBLAZE_DEV_PEER_PROFILE_KERNELS  peerprofile's ncu kernel filter for SonicMoE, a regex (default:
                                 Gemm, QuACK's GEMM kernels); moeblaze's takes the profile
                                 families (MOEBLAZE_DEV_PROFILE_FAMILIES)
  MOEBLAZE_QUACK_RESTORE         peerprofile: a quack_cache_new.tgz of an earlier suite run
                                 (bench/quack_cache_restore.sh), else SonicMoE's first backward
                                 compiles ~30 QuACK kernels (2-3.5 minutes)
For the commands it runs it sets MOEBLAZE_LIBRARY (BUILD/lib/libmoeblaze_c.so) and PYTHONPATH
(python/), and MOEBLAZE_CACHE when unset (/tmp/moeblaze-dev-cache.db: a user's cache is not
touched).

Examples:
  MOEBLAZE_DEV_OUT=out tools/gpu_run.sh                   # the regression pass
  MOEBLAZE_DEV_PRESETS="mixtral-8x7b gpt-oss-20b olmoe-1b-7b qwen3-30b-a3b deepseek-v3 qwen3-next-80b" \
    tools/gpu_run.sh defaults tune tuned                  # every suite preset
  MOEBLAZE_DEV_SUITE_SHAPES=mixtral-8x7b,gpt-oss-20b,olmoe-1b-7b,qwen3-30b-a3b,deepseek-v3,qwen3-next-80b \
    MOEBLAZE_DEV_SUITE_ROUTING=random,skewed MOEBLAZE_DEV_SUITE_ARGS=--sweep tools/gpu_run.sh bench
  MOEBLAZE_DEV_TILES="gpt-oss-20b:down_dgrad=128x128x64_w8x1_s3_wgmma" tools/gpu_run.sh tiles
EOF
}

ALL_STEPS="gpu kinds defaults tune import tuned regress tiles py pysuite mem bench profile peerprofile"
DRY=${MOEBLAZE_DEV_DRY_RUN:-}
PRECOMPILE_DB=""
steps=""
want_db=""
for arg in "$@"; do
  if [ -n "$want_db" ]; then
    case $arg in -*|"") echo "gpu_run: --precompile needs a cache file, not '$arg' (see --help)" >&2; exit 2 ;; esac
    PRECOMPILE_DB=$arg DRY=1 want_db=""
    continue
  fi
  case $arg in
    -h|--help) usage; exit 0 ;;
    --list) echo "$ALL_STEPS"; exit 0 ;;
    --dry-run) DRY=1 ;;
    --precompile) want_db=1 ;;
    all) steps="$steps $ALL_STEPS" ;;
    -*) echo "gpu_run: unknown option '$arg' (see --help)" >&2; exit 2 ;;
    *) case " $ALL_STEPS " in
         *" $arg "*) steps="$steps $arg" ;;
         *) echo "gpu_run: unknown step '$arg'; steps: $ALL_STEPS all" >&2; exit 2 ;;
       esac ;;
  esac
done
[ -z "$want_db" ] || { echo "gpu_run: --precompile needs a cache file (see --help)" >&2; exit 2; }
steps=${steps:-gpu kinds defaults py}

OUT=${MOEBLAZE_DEV_OUT:-device-out}
LOG=$OUT/logs
BUILD=${MOEBLAZE_DEV_BUILD:-build}
BIN=$BUILD/bin/moeblaze
PRESETS=${MOEBLAZE_DEV_PRESETS:-qwen3-30b-a3b}
SUITE_PRESETS="mixtral-8x7b gpt-oss-20b olmoe-1b-7b qwen3-30b-a3b deepseek-v3 qwen3-next-80b"
mkdir -p "$LOG"
[ -x "$BIN" ] || { echo "gpu_run: $BIN not found (set MOEBLAZE_DEV_BUILD to the build folder)" >&2; exit 2; }
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
case $BUILD in /*) build_abs=$BUILD ;; *) build_abs=$PWD/$BUILD ;; esac
export MOEBLAZE_LIBRARY=$build_abs/lib/libmoeblaze_c.so PYTHONPATH=$PWD/python PYTHONUNBUFFERED=1
export MOEBLAZE_CACHE=${MOEBLAZE_CACHE:-/tmp/moeblaze-dev-cache.db}
# The checks take the binaries the cache holds (compiled by an earlier step, or carried in from
# --precompile) and keep what they compile; their tiles stay the defaults or the forced ones.
CACHE_DB="--db $MOEBLAZE_CACHE"
T_END=$(( $(date +%s) + ${MOEBLAZE_DEV_DEADLINE_S:-3600} ))
[ -n "$DRY" ] || nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu \
  --format=csv > "$LOG/gpu.txt" 2>&1
FAILS=0
LAST_RC=0

pack() { tar czf "$OUT/logs.tar.gz" -C "$OUT" logs; }

# Nsight Compute's report of a profiled run, kept as files: NAME.ncu-rep (open it in the Nsight
# Compute GUI), NAME_details.txt (the sections' tables), NAME_raw.csv.gz (every metric collected)
# and, when SourceCounters ran, NAME_source.csv.gz (per-SASS-instruction samples of each kernel).
ncu_export_args() { mkdir -p "$OUT/ncu"; echo "--export $OUT/ncu/$1 --force-overwrite"; }
ncu_pages() {
  local rep=$OUT/ncu/$1
  [ -z "$DRY" ] && [ -f "$rep.ncu-rep" ] || return 0
  ncu --import "$rep.ncu-rep" --page details > "${rep}_details.txt" 2>&1
  ncu --import "$rep.ncu-rep" --page raw --csv 2>&1 | gzip > "${rep}_raw.csv.gz"
  case " ${MOEBLAZE_DEV_PROFILE_SECTIONS:-} " in
    *" SourceCounters "*) ncu --import "$rep.ncu-rep" --page source --print-source sass --csv 2>&1 | gzip > "${rep}_source.csv.gz" ;;
  esac
}

# The check-only form of a moeblaze check or bench (same shape and tiles), nothing for others;
# with --precompile, the same kernels compiled into its cache file.
dry_command() {
  if [ "$1" = ncu ]; then  # a profiled Python step: its arguments, checked without a GPU
    while [ $# -gt 0 ] && [ "$1" != bench/ncu_step.py ]; do shift; done
    [ $# -gt 0 ] && echo "python3 $* --check"
    return 0
  fi
  [ "$1" = "$BIN" ] || return 0
  case ${2:-} in forward-check|grad-check|bench) ;; *) return 0 ;; esac
  shift 2
  local out="$BIN generate --check-only" preset="" tokens=""
  [ -z "$PRECOMPILE_DB" ] || out="$BIN generate --quiet --db $PRECOMPILE_DB"
  while [ $# -gt 0 ]; do
    case $1 in
      --preset) preset=$2; out="$out $1 $2"; shift 2 ;;
      -T) tokens=$2; out="$out $1 $2"; shift 2 ;;
      -E|-K|-d|-n|--activation|--router|--tile|--route-scale) out="$out $1 $2"; shift 2 ;;
      --renormalize) out="$out $1"; shift ;;
      --mode|--routing|--steps|--samples|--seed|--db) shift 2 ;;
      *) shift ;;  # flags: --no-cache, --tuned, --accumulate-fp32, --json
    esac
  done
  # A preset's check runs at its T, whose default tiles generate picks only when told.
  if [ -n "$preset" ] && [ -z "$tokens" ]; then
    tokens=$($BIN presets 2>/dev/null | awk -v p="$preset" '$1 == p { for (i = 2; i <= NF; i++) if ($i ~ /^T=/) print substr($i, 3) }')
    [ -z "$tokens" ] || out="$out -T $tokens"
  fi
  echo "$out"
}

# expect WANT NAME LIMIT CMD...: runs CMD with a time limit, its log in $LOG/NAME.log; a
# status other than WANT counts as a failure.
expect() {
  local want=$1 name=$2 limit=$3; shift 3
  if [ -n "$DRY" ]; then
    local dry
    dry=$(dry_command "$@")
    if [ -z "$dry" ]; then echo "$name: dry run, skipped" | tee -a "$OUT/summary.txt"; LAST_RC=0; return; fi
    set -- $dry
    want=0
  fi
  local t0 left
  t0=$(date +%s)
  left=$(( T_END - t0 ))
  [ "$left" -lt "$limit" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    echo "$name skipped: deadline" | tee -a "$OUT/summary.txt"
    LAST_RC=124 FAILS=$((FAILS + 1))
    return
  fi
  timeout "$limit" "$@" > "$LOG/$name.log" 2>&1
  LAST_RC=$?
  printf '%-40s rc=%-3s %4ss | %s\n' "$name" "$LAST_RC" "$(( $(date +%s) - t0 ))" \
    "$(grep -E '^(PASS|FAIL)|step .* ms|passed|failed|slower|every tile legal|kernels compiled|one step profiled|arguments valid' "$LOG/$name.log" | tail -n 3 | tr '\n' ' ' | cut -c1-200)" \
    | tee -a "$OUT/summary.txt"
  if [ "$LAST_RC" -ne "$want" ]; then
    echo "  expected rc=$want; the log's end:" | tee -a "$OUT/summary.txt"
    tail -n 15 "$LOG/$name.log"
    FAILS=$((FAILS + 1))
  fi
  pack
}
check() { expect 0 "$@"; }

# The profile steps' GEMM families (a regex alternation) and ncu sections.
profile_families() { echo "${MOEBLAZE_DEV_PROFILE_FAMILIES:-gate_up|down_proj|gate_up_dgrad|gate_up_wgrad|down_dgrad|down_wgrad}"; }
profile_sections() {
  local x out=""
  for x in ${MOEBLAZE_DEV_PROFILE_SECTIONS:-SpeedOfLight MemoryWorkloadAnalysis ComputeWorkloadAnalysis WarpStateStats SchedulerStats Occupancy LaunchStats}; do
    out="$out --section $x"
  done
  echo "$out"
}

# ---- tile kinds: the tiles each kind runs (--tile FAMILY=TILE ...) and its small cases ----
kind_tiles() {
  case $1 in
    wgmma|ws)
      local x=_$1 t="--tile gate_up=128x128x64_w8x1_s3_$1 --tile down_proj=128x256x64_w8x1_s3_$1"
      t="$t --tile router_logits=128x64x64_w8x1_s4$x"
      for f in down_dgrad down_wgrad gate_up_wgrad gate_up_dgrad router_dgrad router_wgrad; do t="$t --tile $f=128x128x64_w8x1_s4$x"; done
      echo "$t" ;;
    persist)  # persistent expert GEMMs; the router GEMMs cannot be persistent and run _ws
      local t="--tile gate_up=128x128x64_w8x1_s3_persist --tile down_proj=128x256x64_w8x1_s3_persist"
      t="$t --tile router_logits=128x64x64_w8x1_s4_ws"
      for f in down_dgrad down_wgrad gate_up_wgrad gate_up_dgrad; do t="$t --tile $f=128x256x64_w8x1_s4_persist"; done
      for f in router_dgrad router_wgrad; do t="$t --tile $f=128x128x64_w8x1_s4_ws"; done
      echo "$t" ;;
    # The TMA kinds run the one-tile (_ws) or persistent (_persist) form that the defaults do not.
    tma_fwd) echo "--tile gate_up=128x128x64_w8x1_s4_ws_tmacontig --tile down_proj=128x256x64_w8x1_s4_ws_tmacontig" ;;
    tma_wgrad) echo "--tile gate_up_wgrad=128x256x64_w8x1_s4_ws_tmacontig --tile down_wgrad=128x256x64_w8x1_s4_ws_tmacontig" ;;
    tma_dgrad) echo "--tile gate_up_dgrad=128x256x64_w8x1_s4_persist_tmacontig --tile down_dgrad=128x256x64_w8x1_s4_ws_tmacontig" ;;
    bn192) echo "--tile down_proj=128x192x64_w8x1_s4_persist_tmacontig --tile gate_up_dgrad=128x192x64_w8x1_s4_ws_tmacontig --tile gate_up_wgrad=128x192x64_w8x1_s4_persist_tmacontig" ;;
    # Widths between the 64-column steps: gate_up and down_proj, TMA weight loads, register stores.
    bn_narrow) echo "--tile gate_up=128x96x64_w8x1_s5_persist_tmacontig --tile down_proj=128x160x64_w8x1_s5_persist_tmacontig" ;;
    bn_narrow_wide) echo "--tile gate_up=128x160x64_w8x1_s4_persist_tmacontig --tile down_proj=128x208x64_w8x1_s4_persist_tmacontig" ;;
    bn224) echo "--tile down_proj=128x224x64_w8x1_s4_persist_tmacontig" ;;
    tmastore) echo "--tile gate_up_wgrad=128x256x64_w8x1_s3_persist_tmacontig_tmastore --tile down_wgrad=128x256x64_w8x1_s3_persist_tmacontig_tmastore" ;;
    tmastore_small) echo "--tile gate_up_wgrad=128x128x64_w8x1_s4_persist_tmacontig_tmastore --tile down_wgrad=128x256x64_w8x1_s3_ws_tmastore" ;;
    slot_tmastore) echo "--tile down_proj=128x256x64_w8x1_s3_persist_tmacontig_tmastore --tile gate_up_dgrad=128x256x64_w8x1_s3_persist_tmacontig_tmastore" ;;
    tmastore64)  # 64-column staging blocks beside four stages, every TMA-store family
      local t="--tile down_proj=128x256x64_w8x1_s4_persist_tmacontig_tmastore64 --tile gate_up_dgrad=128x256x64_w8x1_s4_persist_tmacontig_tmastore64"
      echo "$t --tile gate_up_wgrad=128x256x64_w8x1_s4_persist_tmacontig_tmastore64 --tile down_wgrad=128x256x64_w8x1_s4_persist_tmacontig_tmastore64" ;;
    wgrad256)  # weight gradients on 256x128 two-slab tiles: a gathered B stage serves 256 rows
      echo "--tile gate_up_wgrad=256x128x64_w8x1_s3_persist_tmacontig_tmastore --tile down_wgrad=256x128x64_w8x1_s3_persist_tmacontig_tmastore" ;;
    directarrive)  # the default warp-specialised tiles with the producer's copies arriving on full[s]
      local t="--tile gate_up=128x128x64_w8x1_s4_persist_tmacontig_directarrive --tile down_proj=128x256x64_w8x1_s3_persist_tmacontig_tmastore_directarrive"
      t="$t --tile down_dgrad=128x256x64_w8x1_s4_persist_tmacontig_directarrive --tile gate_up_dgrad=128x256x64_w8x1_s3_persist_tmacontig_tmastore_directarrive"
      echo "$t --tile gate_up_wgrad=128x256x64_w8x1_s3_persist_tmacontig_tmastore_directarrive --tile down_wgrad=128x256x64_w8x1_s3_persist_tmacontig_tmastore_directarrive" ;;
    dgrad_wide) echo "--tile down_dgrad=128x256x64_w8x1_s4_persist_tmacontig" ;;
    dgrad_narrow) echo "--tile down_dgrad=128x128x64_w8x1_s4_persist_tmacontig" ;;
    altorder) echo "--tile gate_up=128x128x64_w8x1_s4_persist_tmacontig_altorder --tile down_proj=128x256x64_w8x1_s4_persist_tmacontig_altorder --tile down_wgrad=128x256x64_w8x1_s4_persist_tmacontig_altorder" ;;
    pingpong)  # ping-pong: 128 rows a warpgroup (the gated gate_up's W1 and W3 tiles 64 wide each)
      local t="--tile gate_up=128x64x64_w4x1_s6_pingpong_tmacontig --tile down_proj=128x128x64_w4x1_s6_pingpong_tmacontig"
      t="$t --tile down_dgrad=128x128x64_w4x1_s6_pingpong_tmacontig --tile gate_up_dgrad=128x128x64_w4x1_s6_pingpong_tmacontig"
      echo "$t --tile gate_up_wgrad=128x128x64_w4x1_s4_pingpong_tmacontig_tmastore --tile down_wgrad=128x128x64_w4x1_s4_pingpong_tmacontig_tmastore" ;;
    pingpong64) echo "--tile gate_up=64x128x64_w4x1_s5_pingpong_tmacontig --tile down_proj=64x256x64_w4x1_s5_pingpong_tmacontig --tile gate_up_wgrad=128x128x64_w4x1_s4_pingpong_tmacontig" ;;
    cluster)  # cluster pairs: two blocks share each weight stage by TMA multicast
      local t="--tile gate_up=128x128x64_w8x1_s4_persist_tmacontig_cluster2x1 --tile down_proj=128x256x64_w8x1_s4_persist_tmacontig_cluster2x1"
      echo "$t --tile down_dgrad=128x256x64_w8x1_s4_persist_tmacontig_cluster2x1 --tile gate_up_dgrad=128x256x64_w8x1_s4_persist_tmacontig_cluster2x1" ;;
    # A ping-pong warpgroup holding a whole 128 x 192 tile (56 / 224 registers): QuACK's gate_up shape.
    pingpong_wide) echo "--tile gate_up=128x96x64_w4x1_s5_pingpong_tmacontig --tile down_proj=128x192x64_w4x1_s5_pingpong_tmacontig" ;;
    pingpong_wide_cluster) echo "--tile gate_up=128x96x64_w4x1_s5_pingpong_tmacontig_cluster2x1 --tile down_proj=128x160x64_w8x1_s4_persist_tmacontig_cluster2x1" ;;
    pingpong_cluster) echo "--tile gate_up=64x128x64_w4x1_s5_pingpong_tmacontig_cluster2x1 --tile down_proj=64x256x64_w4x1_s5_pingpong_tmacontig_cluster2x1" ;;
    # The kernel layer (templates/moeblaze/sm90, _cute): all six expert GEMMs on the one skeleton,
    # ping-pong where it runs them and cooperative for the weight gradients; then the other
    # schedules (and gate_up_dgrad's cluster pair).
    cute)
      local s=_tmacontig_tmastore_cute
      local t="--tile gate_up=128x64x64_w4x1_s5_pingpong$s --tile down_proj=128x128x64_w4x1_s6_pingpong$s"
      t="$t --tile down_dgrad=128x128x64_w4x1_s4_pingpong$s --tile gate_up_dgrad=128x128x64_w4x1_s6_pingpong$s"
      echo "$t --tile down_wgrad=128x128x64_w8x1_s5_persist$s --tile gate_up_wgrad=128x128x64_w8x1_s5_persist$s" ;;
    # gate_up's default on the layer: 128 x (2 x 96), H and h in 32-column boxes.
    cute96) echo "--tile gate_up=128x96x64_w4x1_s4_pingpong_tmacontig_tmastore_cute" ;;
    # Its cluster pair (W1 | W3 multicast, a map per block): mixtral-8x7b's default, forward in
    # slot chunks there (n > d).
    cute96_pair) echo "--tile gate_up=128x96x64_w4x1_s4_pingpong_tmacontig_tmastore_cluster2x1_cute" ;;
    # The weight gradients' two-block staging: 4-stage 128x256 tiles, QuACK's down_wgrad pair
    # (256 gathered dy columns a block, hg multicast) and the 256-row gate_up_wgrad.
    cute_wgrad)
      local s=_tmacontig_tmastore
      echo "--tile down_wgrad=256x128x64_w8x1_s3_persist${s}_cluster2x1_cute --tile gate_up_wgrad=128x256x64_w8x1_s4_persist${s}_cute" ;;
    cute_wgrad_fused)  # the few-slot default's tile, into the fused gate_up layout's dW1 | dW3
      echo "--tile gate_up_wgrad=128x256x64_w8x1_s4_persist_tmacontig_tmastore_cute" ;;
    cute_wgrad_alt)
      local s=_tmacontig_tmastore
      echo "--tile down_wgrad=128x256x64_w8x1_s4_persist${s}_cute --tile gate_up_wgrad=256x128x64_w8x1_s3_persist${s}_cute" ;;
    cute_alt)
      local s=_tmacontig_tmastore
      local t="--tile gate_up=128x64x64_w8x1_s5_persist${s}_cute --tile down_proj=128x256x64_w8x1_s3_persist${s}_cute"
      t="$t --tile down_dgrad=128x128x64_w8x1_s4_persist${s}_cute --tile gate_up_dgrad=128x128x64_w4x1_s6_pingpong${s}_cluster2x1_cute"
      echo "$t --tile down_wgrad=128x256x64_w8x1_s3_persist${s}_cute --tile gate_up_wgrad=128x128x64_w4x1_s6_pingpong${s}_cute" ;;
  esac
}
ALL_KINDS="wgmma ws persist tma_fwd tma_wgrad tma_dgrad bn192 bn_narrow bn_narrow_wide bn224 tmastore tmastore_small slot_tmastore tmastore64 directarrive wgrad256 dgrad_wide
dgrad_narrow altorder pingpong pingpong64 cluster pingpong_cluster pingpong_wide pingpong_wide_cluster cute cute_alt cute96 cute96_pair cute_wgrad cute_wgrad_alt cute_wgrad_fused"
KINDS=${MOEBLAZE_DEV_KINDS:-$ALL_KINDS}
for k in $KINDS; do
  case " $(echo $ALL_KINDS) " in *" $k "*) ;; *) echo "gpu_run: unknown kind '$k' in MOEBLAZE_DEV_KINDS; kinds: $(echo $ALL_KINDS)" >&2; exit 2 ;; esac
done

# Small shapes, each for a reason: (E K d n T, then routing, mode, activation or precision).
case_args() {
  case $1 in
    fwd) echo "forward-check -E 8 -K 2 -d 256 -n 128 -T 300" ;;
    grad) echo "grad-check -E 8 -K 2 -d 256 -n 128 -T 300" ;;
    skew) echo "grad-check -E 64 -K 8 -d 256 -n 192 -T 1000 --router none --routing skewed --activation silu" ;;  # hot experts, one up matrix
    skew_gated) echo "grad-check -E 64 -K 8 -d 256 -n 256 -T 1000 --router none --routing skewed" ;;  # hot experts (experts above 128 slots)
    aligned_recompute_gated) echo "grad-check -E 60 -K 4 -d 192 -n 256 -T 777 --mode recompute" ;;
    ragged) echo "grad-check -E 60 -K 4 -d 200 -n 200 -T 777 --activation geglu" ;;  # partial tiles both ways; gate_up_wgrad tiles straddle dW1 | dW3
    ragged_cols) echo "grad-check -E 60 -K 4 -d 200 -n 256 -T 777" ;;  # partial column tiles only
    aligned) echo "grad-check -E 60 -K 4 -d 192 -n 256 -T 777 --activation geglu" ;;  # d, n multiples of 64 (TMA dgrad weight stages)
    aligned_recompute) echo "grad-check -E 60 -K 4 -d 192 -n 256 -T 777 --mode recompute --activation gelu" ;;
    aligned_chunked) echo "grad-check -E 8 -K 2 -d 128 -n 1024 -T 1000 --router none --routing skewed" ;;
    dgrad_ragged) echo "grad-check -E 60 -K 4 -d 192 -n 200 -T 777 --activation geglu" ;;  # d % 64 = 0, a partial last N tile
    recompute) echo "grad-check -E 60 -K 4 -d 136 -n 200 -T 777 --mode recompute --activation geglu" ;;
    straddle_recompute) echo "grad-check -E 60 -K 4 -d 200 -n 200 -T 777 --mode recompute" ;;
    chunked) echo "grad-check -E 8 -K 2 -d 128 -n 1000 -T 1000 --router none --routing skewed" ;;  # n > d: slot and column chunks
    chunked_recompute) echo "grad-check -E 6 -K 2 -d 192 -n 520 -T 777 --mode recompute --activation gelu" ;;
    fp32) echo "grad-check -E 8 -K 2 -d 256 -n 128 -T 300 --accumulate-fp32" ;;
    cols192) echo "grad-check -E 8 -K 2 -d 384 -n 192 -T 300" ;;  # 192-wide tiles fill d and n exactly
    ragged192) echo "grad-check -E 60 -K 4 -d 448 -n 320 -T 777 --activation geglu" ;;
    skew192) echo "grad-check -E 64 -K 8 -d 576 -n 192 -T 1000 --router none --routing skewed" ;;
    fused_gated) echo "grad-check -E 64 -K 8 -d 256 -n 256 -T 1000 --router none --routing skewed --weight-layout fused" ;;  # hot experts
    fused_fp32) echo "grad-check -E 16 -K 4 -d 256 -n 128 -T 700 --weight-layout fused --accumulate-fp32" ;;
    fused_chunked_recompute) echo "grad-check -E 8 -K 2 -d 256 -n 768 -T 600 --mode recompute --weight-layout fused" ;;  # n > d
  esac
}
kind_cases() {
  case $1 in
    wgmma|ws|persist) echo "fwd grad skew recompute" ;;
    tma_fwd) echo "fwd recompute skew chunked" ;;
    tma_wgrad) echo "recompute skew chunked fp32" ;;
    tma_dgrad) echo "aligned skew" ;;
    bn192) echo "cols192 ragged192 skew192" ;;
    bn_narrow) echo "grad ragged recompute skew chunked" ;;
    bn_narrow_wide|bn224) echo "grad ragged skew" ;;
    tmastore) echo "grad ragged_cols ragged skew chunked fp32" ;;
    tmastore_small) echo "straddle_recompute" ;;
    slot_tmastore) echo "aligned skew aligned_recompute" ;;  # TMA dgrad loads need n % 64 == 0
    tmastore64) echo "aligned skew aligned_recompute fp32" ;;
    directarrive) echo "aligned skew aligned_recompute aligned_chunked fp32" ;;
    wgrad256) echo "grad ragged_cols ragged skew chunked fp32" ;;
    dgrad_wide) echo "grad dgrad_ragged skew chunked chunked_recompute" ;;
    dgrad_narrow) echo "dgrad_ragged" ;;
    altorder) echo "grad skew chunked" ;;
    pingpong) echo "grad aligned skew aligned_recompute aligned_chunked fp32" ;;
    pingpong64) echo "grad skew fp32" ;;
    cluster) echo "grad aligned skew aligned_recompute aligned_chunked" ;;
    pingpong_cluster) echo "grad skew aligned_chunked" ;;
    pingpong_wide) echo "grad aligned skew aligned_recompute aligned_chunked ragged" ;;
    pingpong_wide_cluster) echo "grad skew aligned_chunked ragged" ;;
    cute) echo "grad skew_gated aligned aligned_recompute_gated aligned_chunked fp32" ;;  # gated, d % 64 = 0, n % 128 = 0
    cute_alt) echo "skew_gated aligned aligned_recompute_gated aligned_chunked" ;;  # and n % 256 = 0 (its 256-wide down_wgrad)
    cute96) echo "grad skew_gated ragged aligned_recompute_gated chunked aligned_chunked" ;;  # gated; partial column tiles, n > d
    cute96_pair) echo "grad skew_gated ragged aligned_recompute_gated chunked aligned_chunked" ;;  # and empty pair halves
    cute_wgrad) echo "skew_gated aligned aligned_recompute_gated aligned_chunked fp32" ;;  # n % 128 = 0 (the pair's hg boxes)
    cute_wgrad_alt) echo "skew_gated aligned aligned_recompute_gated aligned_chunked" ;;  # n % 256 = 0
    cute_wgrad_fused) echo "fused_gated fused_fp32 fused_chunked_recompute" ;;  # G n % 128 = 0, d % 256 = 0
  esac
}

for s in $steps; do case $s in
gpu) check gpu_tests 900 "$BUILD/bin/moeblaze_gpu_tests" ;;  # the layer cases and the tile table's fast rows
kinds)
  for k in $KINDS; do
    tiles=$(kind_tiles "$k")
    first=1
    for c in $(kind_cases "$k"); do
      check "${k}_$c" 120 $BIN $(case_args "$c") $tiles $CACHE_DB
      # A kind that fails (or hangs) its first, smallest check gets no more device time.
      if [ $first = 1 ] && [ "$LAST_RC" -ne 0 ]; then echo "$k: first check failed, kind skipped" | tee -a "$OUT/summary.txt"; break; fi
      first=0
    done
    [ "$LAST_RC" -eq 0 ] || continue
    for p in ${MOEBLAZE_DEV_KIND_PRESETS:-}; do
      # A kind whose tiles a preset cannot take (e.g. cute's 128-wide down_wgrad on n = 2880) is
      # reported and left out there, with the reason.
      if ! why=$($BIN generate --preset "$p" $tiles --check-only --quiet 2>&1 >/dev/null); then
        echo "${k}_grad_$p skipped: $(echo "$why" | tail -n 1 | cut -c1-160)" | tee -a "$OUT/summary.txt"
        continue
      fi
      check "${k}_grad_$p" 240 $BIN grad-check --preset "$p" $tiles $CACHE_DB
    done
  done ;;
defaults)
  check default_chunked 120 $BIN $(case_args chunked) $CACHE_DB
  check default_chunked_recompute 120 $BIN $(case_args chunked_recompute) $CACHE_DB
  for p in $PRESETS; do
    check "default_grad_$p" 240 $BIN grad-check --preset "$p" $CACHE_DB
    check "default_recompute_$p" 240 $BIN grad-check --preset "$p" --mode recompute $CACHE_DB
    check "default_skewed_$p" 240 $BIN grad-check --preset "$p" --router none --routing skewed $CACHE_DB
  done ;;
tune)
  for p in $PRESETS; do
    check "tune_$p" 400 $BIN tune --preset "$p" --budget "${MOEBLAZE_DEV_TUNE_BUDGET:-75}" \
      --candidates "${MOEBLAZE_DEV_TUNE_CANDIDATES:-8}"
  done
  # The tuned cache comes back as tuned.db.xz (carry it and run the import step to reuse it):
  # export drops the losers' binaries, xz packs the rest about 16:1 (a kernel-layer cubin is
  # 1.4-2.3 MB, mostly symbol tables and embedded PTX; the device returns files of 16 MiB).
  if [ -z "$DRY" ]; then
    rm -f "$OUT/tuned.db" "$OUT/tuned.db.xz"
    $BIN cache export "$OUT/tuned.db" > "$LOG/cache_export.log" 2>&1 && xz -T0 -6 "$OUT/tuned.db"
  fi ;;
import)
  src=${MOEBLAZE_DEV_IMPORT:-$BUILD/tuned.db.xz}
  case $src in
    *.xz) [ -n "$DRY" ] || { xz -dc "$src" > "$OUT/import.db" || echo "gpu_run: cannot unpack $src" >&2; }; src=$OUT/import.db ;;
  esac
  check cache_import 60 $BIN cache import "$src" ;;
tuned) for p in $PRESETS; do check "tuned_grad_$p" 240 $BIN grad-check --preset "$p" --tuned; done ;;
regress)
  p=${PRESETS%% *}
  base=$OUT/baseline-$p.json
  check "regress_tune_$p" 400 $BIN tune --preset "$p" --budget "${MOEBLAZE_DEV_TUNE_BUDGET:-75}" \
    --candidates "${MOEBLAZE_DEV_TUNE_CANDIDATES:-8}" --baseline-out "$base"
  check "regress_pass_$p" 200 $BIN regress --baseline "$base"
  expect 1 "regress_forced_$p" 200 $BIN regress --baseline "$base" --force gate_up=64x64x64_w2x2_s2 ;;
tiles)
  for c in ${MOEBLAZE_DEV_TILES:-}; do
    p=${c%%:*}
    check "tile_grad_${p}_${c#*:}" 240 $BIN grad-check --preset "$p" --tile "${c#*:}" $CACHE_DB
    check "tile_bench_${p}_${c#*:}" 200 $BIN bench --preset "$p" --no-cache --tile "${c#*:}"
    check "default_bench_${p}_for_${c#*:}" 200 $BIN bench --preset "$p" --no-cache
  done ;;
py) check py_tests 400 python3 -m pytest -x -q python/tests ;;
pysuite) check py_suite_tests 500 env MOEBLAZE_SUITE=1 python3 -m pytest -x -q python/tests/test_torch_gpu.py -k module_matches ;;
mem) check memory_probe 200 python3 bench/memory_probe.py --shapes "${MOEBLAZE_DEV_MEM_SHAPES:-mixtral-8x7b}" ;;
bench)
  check suite 580 python3 bench/suite.py --shapes "${MOEBLAZE_DEV_SUITE_SHAPES:-qwen3-30b-a3b}" \
    --routing "${MOEBLAZE_DEV_SUITE_ROUTING:-random}" --out "$OUT/suite" ${MOEBLAZE_DEV_SUITE_ARGS:-} ;;
profile)
  pf=$(profile_families)
  preset=${MOEBLAZE_DEV_PROFILE_PRESET:-mixtral-8x7b}
  sections=$(profile_sections)
  if [ -n "$DRY" ]; then  # the profiled run's shape and tiles, checked like a bench
    check "profile_$preset" 60 $BIN bench --preset "$preset" ${MOEBLAZE_DEV_PROFILE_ARGS:-}
  else
    check "profile_$preset" 400 ncu --target-processes all -k "regex:mb_($pf)_E[0-9]" \
      --launch-count "$(echo "$pf" | tr '|' '\n' | wc -l)" $sections $(ncu_export_args "profile_$preset") \
      $BIN bench --preset "$preset" --no-cache --steps 10 ${MOEBLAZE_DEV_PROFILE_ARGS:-}
    ncu_pages "profile_$preset"
  fi ;;
peerprofile)
  preset=${MOEBLAZE_DEV_PROFILE_PRESET:-mixtral-8x7b}
  sections=$(profile_sections)
  if [ -z "$DRY" ] && [ -n "${MOEBLAZE_QUACK_RESTORE:-}" ]; then
    bench/quack_cache_restore.sh "$MOEBLAZE_QUACK_RESTORE" >> "$LOG/peerprofile_restore.log" 2>&1 ||
      { echo "peerprofile: restoring $MOEBLAZE_QUACK_RESTORE failed (see logs/peerprofile_restore.log)" | tee -a "$OUT/summary.txt"; FAILS=$((FAILS + 1)); }
  fi
  for impl in ${MOEBLAZE_DEV_PEER_PROFILE_IMPLS:-sonicmoe moeblaze}; do
    case $impl in
      moeblaze*) kernels="regex:mb_($(profile_families))_E[0-9]" ;;
      *) kernels="regex:${MOEBLAZE_DEV_PEER_PROFILE_KERNELS:-Gemm}" ;;
    esac
    # ncu starts profiling at the step's cudaProfilerStart, after the warm-up steps
    check "peerprofile_${impl}_$preset" 580 ncu --profile-from-start off --target-processes all -k "$kernels" \
      $sections $(ncu_export_args "peerprofile_${impl}_$preset") python3 bench/ncu_step.py --impl "$impl" --shape "$preset"
    ncu_pages "peerprofile_${impl}_$preset"
  done ;;
esac; done
[ -n "$DRY" ] || pack
echo "gpu_run: $FAILS command(s) did not end as expected" | tee -a "$OUT/summary.txt"
[ "$FAILS" -eq 0 ]

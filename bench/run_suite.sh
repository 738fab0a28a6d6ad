#!/usr/bin/env bash
# The suite on the GPU machine, from a checkout that carries the build (build/bin, build/lib)
# and the peers (.peers/sonicmoe, .peers/megablocks: copies of /work/shared/peers/*).
#
# Usage: bench/run_suite.sh OUT_DIR [--quick] [suite.py options ...]
#   default  all six shapes, random + skewed routing, the token sweep on qwen3-30b-a3b and
#            deepseek-v3, every impl (moeblaze, moeblaze-recompute, sonicmoe, megablocks,
#            torch-grouped_mm, torch-loop; torch-loop not in the sweep), and the per-kernel
#            comparison with SonicMoE on qwen3-30b-a3b; ~7-8 minutes on an H200 (--dry-run
#            prints the estimate), cut at --deadline-s 500 (the sweep goes first).
#   --quick  the A/B subset: qwen3-30b-a3b and gpt-oss-20b, random routing, moeblaze and
#            sonicmoe, the per-kernel comparison on qwen3-30b-a3b (~1.5 minutes).
#   Later options override (the last of a repeated option wins), e.g. --shapes mixtral-8x7b,
#   --impls moeblaze,sonicmoe,megablocks, --routing random, --kernels none, --no-breakdown,
#   --deadline-s 300, --dry-run.
# OUT_DIR gets results.json, table.md, tflops.png (when matplotlib is there), kernels.md and
# kernels.json; the log goes to stdout only.
# Environment: BUILD (default build), MOEBLAZE_PEERS (default .peers), MOEBLAZE_CACHE (default
# /tmp/moeblaze-cache.db: a warm cache from an earlier step of the same call saves NVRTC time),
# SONIC_SITE / MB_SITE (where the peers unpack, default /tmp/sonic-site, /tmp/mb-site),
# MOEBLAZE_COMMIT (what results.json records as the commit; default: git describe --dirty of this
# checkout, which is stale where the checkout's files were copied over an older .git),
# MOEBLAZE_QUACK_RESTORE (a quack_cache_new.tgz an earlier run wrote: SonicMoE's QuACK kernels
# that its payload lacks, compiled once; without it the first SonicMoE backward compiles them,
# 2-3.5 minutes).
# A full run without the sweep: bench/run_suite.sh OUT --no-sweep --impls moeblaze,moeblaze-recompute,
# sonicmoe,megablocks,torch-grouped_mm --kernels qwen3-30b-a3b,mixtral-8x7b,gpt-oss-20b: about 10
# minutes with the QuACK kernels restored (--dry-run's estimate is low for the peers' cases); the
# random cases and the comparison fit --deadline-s 500.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
OUT=$1
shift
BUILD=${BUILD:-build}
LIB=$PWD/$BUILD/lib/libmoeblaze_c.so
if [ ! -f "$LIB" ]; then
  echo "run_suite: $LIB not found: carry $BUILD/lib and $BUILD/bin (BUILD names another build folder)" >&2
  exit 2
fi
export MOEBLAZE_LIBRARY=$LIB PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export MOEBLAZE_CACHE=${MOEBLAZE_CACHE:-/tmp/moeblaze-cache.db}
export MOEBLAZE_PEERS=${MOEBLAZE_PEERS:-$PWD/.peers}
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
for p in sonicmoe megablocks; do
  [ -d "$MOEBLAZE_PEERS/$p" ] || echo "run_suite: no $MOEBLAZE_PEERS/$p: its rows will say so" >&2
done
if [ "${1:-}" = --quick ]; then
  shift
  mode=(--quick)
else
  mode=(--sweep --kernels qwen3-30b-a3b --deadline-s 500)
fi
mkdir -p "$OUT"
# SonicMoE's payload lacks ~30 of the QuACK kernels its backward needs: the first backward
# compiles them (2-3.5 minutes on an H200 machine) into the unpacked site's cache. Restoring the
# files an earlier run saved skips that; this run saves what it compiled for the next.
SONIC_SITE=${SONIC_SITE:-/tmp/sonic-site}
QUACK_CACHE=$SONIC_SITE/quack_cache
if [ -n "${MOEBLAZE_QUACK_RESTORE:-}" ] && [ ! -f "$MOEBLAZE_QUACK_RESTORE" ]; then
  echo "run_suite: MOEBLAZE_QUACK_RESTORE=$MOEBLAZE_QUACK_RESTORE is not a file (a quack_cache_new.tgz of an earlier run)" >&2
  exit 2
fi
if [ -n "${MOEBLAZE_QUACK_RESTORE:-}" ] && [ -d "$MOEBLAZE_PEERS/sonicmoe" ]; then
  SONIC_SITE=$SONIC_SITE bench/quack_cache_restore.sh "$MOEBLAZE_QUACK_RESTORE"
fi
stamp=$(mktemp)
status=0
python3 bench/suite.py "${mode[@]}" --out "$OUT" "$@" || status=$?
if [ -d "$QUACK_CACHE" ]; then
  (cd "$QUACK_CACHE" && find . -type f -newer "$stamp" ! -name '*.lock' > "$stamp.list")
  if [ -s "$stamp.list" ]; then
    (cd "$QUACK_CACHE" && tar czf "$OUT/quack_cache_new.tgz" -T "$stamp.list")
    echo "run_suite: $(wc -l < "$stamp.list") QuACK cache files compiled this run: $OUT/quack_cache_new.tgz" \
         "(MOEBLAZE_QUACK_RESTORE=that file restores them next time)" >&2
  fi
  rm -f "$stamp.list"
fi
rm -f "$stamp"
exit $status

#!/usr/bin/env bash
# CLI tests (no GPU needed): every subcommand's help, outputs, exit codes and messages,
# including cache faults (corrupt file, read-only or unusable --db, concurrent tuners).
# Usage: run_cli_tests.sh PATH_TO_MOEBLAZE
set -u
BIN=$1
TMP=$(mktemp -d)
trap 'chmod -R u+w "$TMP"; rm -rf "$TMP"' EXIT
export MOEBLAZE_CACHE=$TMP/default.db
pass=0
fail=0
check() {  # check NAME EXPECTED_RC PATTERN CMD...
  local name=$1 want=$2 pattern=$3; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -eq "$want" ] && grep -qE -- "$pattern" <<<"$out"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $name (rc $rc, wanted $want; pattern '$pattern')"
    echo "$out" | head -20
  fi
}
gpu=0
"$BIN" grad-check -E 4 -K 1 -d 8 -n 8 -T 1 >/dev/null 2>&1; [ $? -ne 3 ] && gpu=1
SMALL="-E 8 -K 2 -d 64 -n 64"

# ---- help and version -------------------------------------------------------------------
check "help" 0 "generate" "$BIN" --help
for c in presets generate plan forward-check grad-check tune bench regress cache; do
  check "$c --help" 0 "Usage|Options" "$BIN" "$c" --help
done
for c in list show export import verify gc; do
  check "cache $c --help" 0 "Usage|Options" "$BIN" cache "$c" --help
done
check "version" 0 "moeblaze [0-9]" "$BIN" --version
check "no subcommand" 106 "subcommand" "$BIN"

# ---- presets, generate, plan --------------------------------------------------------------
check "presets" 0 "qwen3-30b-a3b .*\[suite\]" "$BIN" presets
check "presets --json" 0 '"name": "deepseek-v3", "E": 256' "$BIN" presets --json
check "generate preset" 0 "16 kernels compiled, 0 with spills" "$BIN" generate --preset olmoe-1b-7b
check "generate json" 0 '"kernels_with_spills": 0' "$BIN" generate $SMALL --json
check "generate plain activation" 0 "0 with spills" "$BIN" generate $SMALL --activation gelu
check "generate wgmma tiles" 0 "up_proj .* wgmma .*_wg" "$BIN" generate --preset qwen3-30b-a3b --tile up_proj=128x128x64_w8x1_s3_wg --tile down_proj=128x256x64_w8x1_s3_wg
check "generate ws tiles" 0 "up_wgrad .* wgmma .*_ws" "$BIN" generate --preset qwen3-30b-a3b --tile up_wgrad=128x128x64_w8x1_s4_ws
check "generate --ptx-dir" 0 "16 kernels compiled" "$BIN" generate --preset qwen3-30b-a3b --ptx-dir "$TMP/ptx"
check "generate --check-only" 0 "16 kernels, every tile legal" "$BIN" generate --check-only --preset mixtral-8x7b --tile up_wgrad=128x256x64_w8x1_s4_wsp_tma_swap
check "generate --check-only illegal tile" 2 "tile: .*down_dgrad: TMA down_dgrad tiles need d % 64" "$BIN" generate --check-only -E 60 -K 4 -d 136 -n 200 --tile down_dgrad=128x256x64_w8x1_s4_ws_tma
check "ptx written" 0 "wgmma.mma_async" grep -h -m1 -o "wgmma.mma_async" "$TMP/ptx/mb_up_proj_E128_K8_d2048_n768_swiglu_128x128x64_w8x1_s4_wsp_tma.ptx"
check "default up_proj loads W1/W3 by TMA" 0 "cp.async.bulk.tensor" grep -h -m1 -o "cp.async.bulk.tensor" "$TMP/ptx/mb_up_proj_E128_K8_d2048_n768_swiglu_128x128x64_w8x1_s4_wsp_tma.ptx"
touch "$TMP/not_a_dir"
check "generate --ptx-dir under a file" 2 "--ptx-dir: .*not a folder" "$BIN" generate $SMALL --ptx-dir "$TMP/not_a_dir/x"
check "generate bad tile" 2 "tile: .*bm/16 x 1 warps" "$BIN" generate $SMALL --tile down_wgrad=128x128x64_w2x4_s3_wg
check "generate malformed tile" 2 "--tile: .*not of the form" "$BIN" generate $SMALL --tile up_proj=big
check "plan" 0 "recompute +held +3.0 MiB" "$BIN" plan --preset qwen3-30b-a3b
check "plan json" 0 '"h_floor_bytes": 805306368' "$BIN" plan --preset qwen3-30b-a3b --json

# ---- bad input ----------------------------------------------------------------------------
check "unknown preset" 2 "unknown preset 'nope'" "$BIN" generate --preset nope
check "K > E" 2 "topk: K = 8 is larger than E = 4" "$BIN" generate -E 4 -K 8 -d 64 -n 64
check "d not multiple of 8" 2 "hidden: d = 100 must be a positive multiple of 8" "$BIN" generate -E 4 -K 2 -d 100 -n 64
check "E = 0" 2 "experts" "$BIN" generate -E 0 -K 1 -d 64 -n 64
check "missing ffn" 2 "--ffn: missing" "$BIN" generate -E 4 -K 2 -d 64
check "preset and shape" 2 "not both" "$BIN" generate --preset mixtral-8x7b -E 4
check "bad activation" 2 "activation" "$BIN" generate $SMALL --activation swish
check "bad mode" 2 "mode: 'fast'" "$BIN" grad-check $SMALL -T 8 --mode fast
check "T = 0" 2 "tokens|--tokens" "$BIN" forward-check $SMALL -T -1
check "skewed with router" 2 "--routing" "$BIN" grad-check --preset qwen3-30b-a3b --routing skewed
check "tune T<0" 2 "--tokens" "$BIN" tune $SMALL -T -5 --db "$TMP/x.db"
check "tune samples" 2 "--samples" "$BIN" tune $SMALL -T 64 --samples 3 --db "$TMP/x.db"
check "tune unknown preset" 2 "unknown preset" "$BIN" tune --preset nope --db "$TMP/x.db"
check "regress missing file" 2 "--baseline: cannot read" "$BIN" regress --baseline "$TMP/none.json"
echo '{"format": "other"}' > "$TMP/bad.json"
check "regress foreign file" 2 "not a moeblaze baseline" "$BIN" regress --baseline "$TMP/bad.json"
check "regress bad force" 2 "--force|tile|family" "$BIN" regress --baseline "$(dirname "$0")/../../bench/baselines/qwen3-30b-a3b.json" --force up_proj=huge

# ---- tune without a GPU: compile into the cache, say timing needs a GPU --------------------
if [ $gpu -eq 0 ]; then
  check "tune compile-only" 0 "skipped timing: timing needs a GPU" "$BIN" tune $SMALL -T 100 --candidates 2 --db "$TMP/t.db"
  check "tune again: all cached" 0 "compiled 0 candidates \([0-9]+ already cached\)" "$BIN" tune $SMALL -T 100 --candidates 2 --db "$TMP/t.db"
  check "tune json" 0 '"timed": false' "$BIN" tune $SMALL -T 100 --candidates 2 --db "$TMP/t.db" --json
  check "tune default db (MOEBLAZE_CACHE)" 0 "$TMP/default.db" "$BIN" tune $SMALL -T 100 --candidates 1
  # Two processes tuning the same shape into one file at once.
  "$BIN" tune $SMALL --activation geglu -T 100 --candidates 3 --db "$TMP/c.db" --quiet > "$TMP/c1.log" 2>&1 &
  p1=$!
  "$BIN" tune $SMALL --activation geglu -T 100 --candidates 3 --db "$TMP/c.db" --quiet > "$TMP/c2.log" 2>&1 &
  p2=$!
  wait $p1; r1=$?; wait $p2; r2=$?
  check "concurrent tunes both succeed" 0 "ok" bash -c "[ $r1 -eq 0 ] && [ $r2 -eq 0 ] && echo ok || cat $TMP/c1.log $TMP/c2.log"
  check "concurrent tunes: cache valid" 0 "integrity ok, [0-9]+ binaries checked, 0 bad" "$BIN" cache verify --db "$TMP/c.db"
  check "bench without GPU" 3 "needs a GPU" "$BIN" bench $SMALL -T 64 --db "$TMP/t.db"
  check "regress without GPU" 0 "skipped, no GPU" "$BIN" regress --baseline "$(dirname "$0")/../../bench/baselines/qwen3-30b-a3b.json"
  check "forward-check without GPU" 3 "needs a GPU" "$BIN" forward-check $SMALL -T 8
  check "grad-check without GPU" 3 "needs a GPU" "$BIN" grad-check $SMALL -T 8
else
  check "forward-check small" 0 "PASS" "$BIN" forward-check $SMALL -T 100
  check "grad-check small" 0 "PASS" "$BIN" grad-check $SMALL -T 100 --router none --routing skewed
  check "tune small" 0 "step fwd\+bwd" "$BIN" tune $SMALL -T 1000 --candidates 3 --db "$TMP/t.db"
  check "bench small" 0 "TFLOP/s" "$BIN" bench $SMALL -T 1000 --db "$TMP/t.db"
fi

# ---- cache administration --------------------------------------------------------------------
check "cache show" 0 "binaries .* winners" "$BIN" cache show --db "$TMP/t.db"
check "cache show json" 0 '"schema_version": 1' "$BIN" cache show --db "$TMP/t.db" --json
check "cache list" 0 "winners in" "$BIN" cache list --db "$TMP/t.db"
check "cache verify" 0 "integrity ok" "$BIN" cache verify --db "$TMP/t.db"
check "cache export" 0 "exported" "$BIN" cache export "$TMP/export.db" --db "$TMP/t.db"
check "cache export exists" 1 "exist" "$BIN" cache export "$TMP/export.db" --db "$TMP/t.db"
check "cache import" 0 "imported [1-9][0-9]* rows" "$BIN" cache import "$TMP/export.db" --db "$TMP/fresh.db"
check "cache import foreign" 1 "not a moeblaze" "$BIN" cache import "$TMP/bad.json" --db "$TMP/fresh.db"
check "cache after failed import" 0 "integrity ok" "$BIN" cache verify --db "$TMP/fresh.db"
check "cache gc" 0 "gc deleted [0-9]+ binaries" "$BIN" cache gc --max-mb 0 --db "$TMP/fresh.db"
check "cache gc negative" 2 "--max-mb" "$BIN" cache gc --max-mb -1 --db "$TMP/fresh.db"
head -c 4096 /dev/urandom > "$TMP/corrupt.db"
check "corrupt cache, read-only command" 1 "not a database.*open it writable" "$BIN" cache show --db "$TMP/corrupt.db"
check "corrupt cache moved aside" 0 "moved to .*corrupt" "$BIN" cache verify --db "$TMP/corrupt.db"
check "corrupt file kept aside" 0 "corrupt-" ls "$TMP"
check "db is a directory" 1 "$TMP" "$BIN" cache show --db "$TMP"
check "db under a file" 1 "$TMP/bad.json" "$BIN" tune $SMALL -T 64 --db "$TMP/bad.json/k.db"
check "read-only open of a missing db" 1 "missing.db" "$BIN" cache list --db "$TMP/missing.db"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

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
    echo "ok   [$((pass + fail))] ${SECONDS}s  $name"  # progress: the whole run takes minutes
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
for c in presets generate plan space forward-check grad-check tune bench regress cache; do
  check "$c --help" 0 "Usage|Options" "$BIN" "$c" --help
done
for c in list show export import verify gc; do
  check "cache $c --help" 0 "Usage|Options" "$BIN" cache "$c" --help
done
check "version" 0 "moeblaze [0-9]" "$BIN" --version
check "no subcommand" 2 "error: A subcommand is required" "$BIN"

# ---- presets, generate, plan --------------------------------------------------------------
check "presets" 0 "qwen3-30b-a3b .*\[suite\]" "$BIN" presets
check "presets --json" 0 '"E": 256' "$BIN" presets --json
check "generate preset" 0 "16 kernels compiled, 0 with spills" "$BIN" generate --preset olmoe-1b-7b
check "generate json" 0 '"kernels_with_spills": 0' "$BIN" generate $SMALL --json
check "generate plain activation" 0 "0 with spills" "$BIN" generate $SMALL --activation gelu
check "generate wgmma tiles" 0 "gate_up .* wgmma .*_wg" "$BIN" generate --preset qwen3-30b-a3b --tile gate_up=128x128x64_w8x1_s3_wgmma --tile down_proj=128x256x64_w8x1_s3_wgmma
check "generate ws tiles" 0 "gate_up_wgrad .* wgmma .*_ws" "$BIN" generate --preset qwen3-30b-a3b --tile gate_up_wgrad=128x128x64_w8x1_s4_ws
check "generate --ptx-dir" 0 "16 kernels compiled" "$BIN" generate --preset qwen3-30b-a3b --ptx-dir "$TMP/ptx"
check "generate --check-only" 0 "16 kernels, every tile legal" "$BIN" generate --check-only --preset mixtral-8x7b --tile gate_up_wgrad=128x256x64_w8x1_s4_persist_tmacontig_altorder
check "older tile spellings still read" 0 "16 kernels, every tile legal" "$BIN" generate --check-only --preset mixtral-8x7b --tile gate_up_wgrad=128x256x64_w8x1_s4_wsp_tma_swap --tile down_proj=128x256x64_w8x1_s4_wsp_tma_c2
check "generate --check-only --source" 0 "extern \"C\" __global__ void __launch_bounds__\([0-9]+, 1\) mb_gate_up_wgrad_E128_K8_d2048_n768_swiglu_" "$BIN" generate --check-only --source --preset qwen3-30b-a3b -T 4096
check "MOEBLAZE_COMPILE_PROCESSES neither 0 nor 1" 2 "MOEBLAZE_COMPILE_PROCESSES: 'yes' is neither 0" env MOEBLAZE_COMPILE_PROCESSES=yes "$BIN" presets
check "MOEBLAZE_COMPILE_PROCESSES=0 compiles in threads" 0 "kernels compiled" env MOEBLAZE_COMPILE_PROCESSES=0 "$BIN" generate -E 8 -K 2 -d 64 -n 64 -T 100 --db "$TMP/threads.db"
check "generate --check-only illegal tile" 2 "tile: .*down_dgrad: TMA down_dgrad tiles need d % 64" "$BIN" generate --check-only -E 60 -K 4 -d 136 -n 200 --tile down_dgrad=128x256x64_w8x1_s4_ws_tmacontig
# The default gate_up's file, whatever its tile (its name ends with the tile).
up_ptx=$(ls "$TMP"/ptx/mb_gate_up_E128_K8_d2048_n768_swiglu_*.ptx 2>/dev/null | head -n 1)
check "ptx written" 0 "wgmma.mma_async" grep -h -m1 -o "wgmma.mma_async" "${up_ptx:-$TMP/ptx/no-gate_up.ptx}"
check "default gate_up loads W1/W3 by TMA" 0 "cp.async.bulk.tensor" grep -h -m1 -o "cp.async.bulk.tensor" "${up_ptx:-$TMP/ptx/no-gate_up.ptx}"
touch "$TMP/not_a_dir"
check "generate --ptx-dir under a file" 2 "--ptx-dir: .*not a folder" "$BIN" generate $SMALL --ptx-dir "$TMP/not_a_dir/x"
check "generate bad tile" 2 "tile: .*bm/16 x 1 warps" "$BIN" generate $SMALL --tile down_wgrad=128x128x64_w2x4_s3_wgmma
check "generate malformed tile" 2 "--tile: .*not of the form" "$BIN" generate $SMALL --tile gate_up=big
check "plan" 0 "recompute +held +3.0 MiB" "$BIN" plan --preset qwen3-30b-a3b
# space: the kernel layer's tile space, ranked by the cost model; bad input named
check "space" 0 "gate_up: 672 points, [0-9]+ legal" "$BIN" space --preset qwen3-30b-a3b --top 3
check "space refused" 0 "refused +[0-9]+: ping-pong tiles have bm 64 or 128" "$BIN" space --preset qwen3-30b-a3b --family down_proj --refused
check "space json" 0 '"predicted_us"' "$BIN" space --preset qwen3-30b-a3b --family gate_up --json
check "space bad family" 2 "family.*router_logits has no tile space" "$BIN" space --preset qwen3-30b-a3b --family router_logits
check "space bad device" 2 "device.*'a100' is not a device model" "$BIN" space --preset qwen3-30b-a3b --device a100
check "space bad top" 2 "top.*0 is not in" "$BIN" space --preset qwen3-30b-a3b --top 0
check "space terms missing file" 2 "terms" "$BIN" space --terms "$TMP/none.json"
echo '[{"E": 8, "K": 2, "d": 512, "n": 256, "T": 512, "family": "nope", "tile": "x"}]' > "$TMP/terms.json"
check "space terms bad row" 2 "terms.*row 0" "$BIN" space --terms "$TMP/terms.json"
echo '[{"E": 8, "K": 2, "d": 512, "n": 256, "T": 512, "family": "down_proj", "tile": "128x128x64_w4x1_s4_pingpong_tmacontig_tmastore_cute"}]' > "$TMP/terms.json"
check "space terms" 0 '"mainloop_us"' "$BIN" space --terms "$TMP/terms.json"
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
check "regress bad force" 2 "--force|tile|family" "$BIN" regress --baseline "$(dirname "$0")/../../bench/baselines/qwen3-30b-a3b.json" --force gate_up=huge

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
cp "$TMP/corrupt.db" "$TMP/corrupt.orig"
check "not a database, read-only command" 1 "not an SQLite database; it is left as it is" "$BIN" cache show --db "$TMP/corrupt.db"
check "not a database, writing command" 1 "not an SQLite database" "$BIN" cache verify --fix --db "$TMP/corrupt.db"
check "not a database: never changed" 0 "" cmp "$TMP/corrupt.db" "$TMP/corrupt.orig"
check "nothing moved aside" 1 "" bash -c "ls '$TMP' | grep -E 'corrupt\.db\.(corrupt|damaged|salvage)'"
check "db is a directory" 1 "$TMP" "$BIN" cache show --db "$TMP"
check "db under a file" 1 "$TMP/bad.json" "$BIN" tune $SMALL -T 64 --db "$TMP/bad.json/k.db"
check "read-only open of a missing db" 1 "missing.db" "$BIN" cache list --db "$TMP/missing.db"

# ---- issue 17: every reproduction gives a clear error or the right result, rows intact -------
rows() { python3 -c "import os,sqlite3,sys; print(sqlite3.connect(os.fsencode(sys.argv[1])).execute('select count(*) from binaries').fetchone()[0])" "$1"; }
cp "$TMP/t.db" "$TMP/base.db"  # the binaries `tune` compiled above
n0=$(rows "$TMP/base.db")
check "test cache has binaries" 0 "^[1-9]" echo "$n0"
# 1. gc caps that overflow, are not numbers or are negative delete nothing.
for cap in 1e13 inf nan 1e30 -inf -1 abc; do
  check "gc --max-mb $cap refused" 2 "--max-mb" "$BIN" cache gc --max-mb "$cap" --db "$TMP/base.db"
  check "gc --max-mb $cap: rows intact" 0 "^$n0\$" rows "$TMP/base.db"
done
check "gc --max-mb '' (an unset variable) refused" 2 "--max-mb: an empty value is not allowed" "$BIN" cache gc --max-mb "" --db "$TMP/base.db"
check "gc --max-mb= refused" 2 "--max-mb: an empty value" "$BIN" cache gc --max-mb= --db "$TMP/base.db"
check "gc empty cap: rows intact" 0 "^$n0\$" rows "$TMP/base.db"
check "gc cap above the size deletes nothing" 0 "gc deleted 0 binaries" "$BIN" cache gc --max-mb 1048576 --db "$TMP/base.db"
check "gc help says what it deletes" 0 "Tuning results are never deleted" "$BIN" cache gc --help
# 2. A damaged page: reported (exit 1), left in place, salvaged only by verify --fix.
cp "$TMP/base.db" "$TMP/damaged.db"
python3 "$(dirname "$0")/craft_cache_files.py" damage "$TMP/damaged.db"
cp "$TMP/damaged.db" "$TMP/damaged.orig"
check "damaged: verify reports it" 1 "integrity FAILED" "$BIN" cache verify --db "$TMP/damaged.db"
check "damaged: list refuses" 1 "damaged.*verify --fix" "$BIN" cache list --db "$TMP/damaged.db"
check "damaged: tune refuses" 1 "damaged" "$BIN" tune $SMALL -T 100 --candidates 1 --db "$TMP/damaged.db"
check "damaged: file unchanged" 0 "" cmp "$TMP/damaged.db" "$TMP/damaged.orig"
check "damaged: plain SQLite reads rows" 0 "^[1-9]" python3 "$(dirname "$0")/craft_cache_files.py" readable "$TMP/damaged.db"
check "damaged: verify --fix salvages" 0 "saved [1-9][0-9]* rows.*kept as .*damaged\.db\.damaged-" bash -c "'$BIN' cache verify --fix --db '$TMP/damaged.db' | tr '\n' ' '"
check "damaged: original kept beside it" 0 "" bash -c "cmp \$(ls '$TMP'/damaged.db.damaged-* | grep -Ev -- '-(wal|shm)\$') '$TMP/damaged.orig'"
check "damaged: salvaged cache verifies" 0 "integrity ok" "$BIN" cache verify --db "$TMP/damaged.db"
# 3. A recursive view in an export is refused at once.
"$BIN" cache export "$TMP/view.db" --db "$TMP/base.db" >/dev/null
python3 "$(dirname "$0")/craft_cache_files.py" recursive-view "$TMP/view.db"
cp "$TMP/base.db" "$TMP/importer.db"
check "import recursive view refused" 1 "binaries is a view.*nothing was imported" timeout 30 "$BIN" cache import "$TMP/view.db" --db "$TMP/importer.db"
check "import recursive view: no WAL growth" 0 "^small$" bash -c "[ \$(stat -c %s '$TMP/importer.db-wal' 2>/dev/null || echo 0) -lt 10000000 ] && echo small"
# 4. Bad rows are left out with a count and a reason; 5. re-importing adds nothing.
"$BIN" cache export "$TMP/rows.db" --db "$TMP/base.db" >/dev/null
python3 "$(dirname "$0")/craft_cache_files.py" bad-rows "$TMP/rows.db"
check "import bad rows: reasons" 0 "binaries.checksum: does not match the cubin" "$BIN" cache import "$TMP/rows.db" --db "$TMP/fresh_rows.db"
check "import bad rows: control characters" 0 "kernel_name: control" "$BIN" cache import "$TMP/rows.db" --db "$TMP/fresh_rows2.db"
check "re-import adds nothing" 0 "imported 0 rows.*already present" "$BIN" cache import "$TMP/rows.db" --db "$TMP/fresh_rows.db"
"$BIN" cache export "$TMP/again.db" --db "$TMP/base.db" >/dev/null
check "re-import of the cache's own rows adds nothing" 0 "imported 0 rows .*\(0 binaries, 0 measurements, 0 winners\); [1-9][0-9]* already present" "$BIN" cache import "$TMP/again.db" --db "$TMP/base.db"
check "re-import: rows intact" 0 "^$n0\$" rows "$TMP/base.db"
check "import help states the trust model" 0 "running its GPU code" "$BIN" cache import --help
# 6. Newer schema refused naming both versions; read-only caches read; a FIFO refused at once.
cp "$TMP/base.db" "$TMP/newer.db"
python3 -c "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.execute('pragma user_version=99'); c.commit()" "$TMP/newer.db"
cp "$TMP/newer.db" "$TMP/newer.orig"
check "newer schema refused" 1 "schema version 99 is newer than this build's 1" "$BIN" cache list --db "$TMP/newer.db"
check "newer schema refused by tune" 1 "schema version 99" "$BIN" tune $SMALL -T 100 --candidates 1 --db "$TMP/newer.db"
check "newer schema unchanged" 0 "" cmp "$TMP/newer.db" "$TMP/newer.orig"
mkfifo "$TMP/fifo.db"
check "FIFO --db refused at once" 1 "FIFO, not a regular file" timeout 10 "$BIN" cache list --db "$TMP/fifo.db"
check "FIFO --baseline refused at once" 2 "--baseline: .*not a regular file" timeout 10 "$BIN" regress --baseline "$TMP/fifo.db"
check "FIFO import refused at once" 1 "a FIFO" timeout 10 "$BIN" cache import "$TMP/fifo.db" --db "$TMP/base.db"
# Root reads and writes whatever the mode bits say: as root, these run as nobody (a copy of
# the binary in a folder nobody can reach).
OTHER_BIN=$BIN AS_OTHER=""
if command -v setpriv >/dev/null && [ "$(id -u)" = 0 ]; then
  AS_OTHER="setpriv --reuid=65534 --regid=65534 --clear-groups"
  OTHER_BIN=$TMP/moeblaze-copy
  cp "$BIN" "$OTHER_BIN" && chmod 0755 "$OTHER_BIN"
fi
mkdir -p "$TMP/ro"
cp "$TMP/base.db" "$TMP/ro/k.db"
chmod 0444 "$TMP/ro/k.db"; chmod 0555 "$TMP/ro"; chmod o+x "$TMP"
check "read-only folder: list" 0 "winners in" $AS_OTHER "$OTHER_BIN" cache list --db "$TMP/ro/k.db"
check "read-only folder: verify" 0 "integrity ok, $n0 binaries" $AS_OTHER "$OTHER_BIN" cache verify --db "$TMP/ro/k.db"
check "read-only folder: gc says read-only" 1 "read-only" $AS_OTHER "$OTHER_BIN" cache gc --max-mb 0 --db "$TMP/ro/k.db"
check "read-only folder: tune says read-only" 1 "read-only" $AS_OTHER "$OTHER_BIN" tune $SMALL -T 100 --candidates 1 --db "$TMP/ro/k.db"
check "read-only folder: rows intact" 0 "^$n0\$" rows "$TMP/ro/k.db"
chmod 0755 "$TMP/ro"
# 7. Parse errors exit 2 naming the option; 8. overflows and non-finite values are refused.
check "unparsable -E" 2 "--experts: 'abc' is not a decimal integer" "$BIN" plan -E abc -K 2 -d 256 -n 256
check "T*K overflow" 2 "--tokens: T\*K" "$BIN" plan -T 1152921504606846976 -K 16 -E 16 -d 256 -n 256
check "T*K at 2^31" 2 "--tokens" "$BIN" plan -T 134217728 -K 16 -E 16 -d 256 -n 256
check "T*K just below 2^31" 0 "T=134217727" "$BIN" plan -T 134217727 -K 16 -E 16 -d 256 -n 256
check "--tolerance nan" 2 "--tolerance: nan is not a finite number" "$BIN" regress --baseline "$(dirname "$0")/../../bench/baselines/qwen3-30b-a3b.json" --tolerance nan
check "--budget nan" 2 "--budget: nan is not a finite number" "$BIN" tune $SMALL -T 64 --budget nan --db "$TMP/x.db"
check "--route-scale inf" 2 "--route-scale: inf is not a finite number" "$BIN" plan $SMALL -T 64 --route-scale inf
check "-d 2147483640" 2 "--hidden: d = 2147483640 is outside \[8, 65536\]" "$BIN" plan -E 8 -K 2 -d 2147483640 -n 64 -T 8
check "-E 2^32+8" 2 "--experts" "$BIN" plan -E 4294967304 -K 2 -d 64 -n 64 -T 8
check "tile with 2^31 warps" 2 "--tile: .*tile" "$BIN" generate --check-only $SMALL --tile gate_up=64x64x64_w2147483648x1_s3
check "tile with 64+ warps" 2 "warps_m = 99999 is outside" "$BIN" generate --check-only $SMALL --tile gate_up=64x64x64_w99999x1_s3
check "--candidates -3" 2 "--candidates: -3 is outside \[1, 1000\]" "$BIN" tune $SMALL -T 64 --candidates -3 --db "$TMP/x.db"
check "--samples huge" 2 "--samples" "$BIN" grad-check $SMALL -T 8 --samples 99999999
check "--steps negative" 2 "--steps" "$BIN" bench $SMALL -T 8 --steps -5
check "--arch not a target" 2 "--arch: 'sm_90a --foo' is not a target" "$BIN" generate --check-only $SMALL --arch "sm_90a --foo"
check "--arch sm_90 is not sm_90a" 2 "--arch: 'sm_90' lacks" "$BIN" generate --check-only $SMALL --arch sm_90
check "--arch another target" 0 "for sm_86: .* every tile legal" "$BIN" generate --check-only $SMALL --arch sm_86
check "tune --routing checked before compiling" 2 "--routing: 'bogus' is not one of" "$BIN" tune $SMALL -T 64 --routing bogus --db "$TMP/x.db"
check "bench --routing" 2 "--routing: 'bogus'" "$BIN" bench $SMALL -T 64 --routing bogus
python3 - "$(dirname "$0")/../../bench/baselines/qwen3-30b-a3b.json" "$TMP/neg.json" "$TMP/bigT.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
neg = json.loads(json.dumps(b)); neg["kernels"][0]["median_ms"] = -1.0
json.dump(neg, open(sys.argv[2], "w"))
big = json.loads(json.dumps(b)); big["tokens"] = 2**60
json.dump(big, open(sys.argv[3], "w"))
PY
check "regress baseline with a negative time" 2 "--baseline: .*median_ms = -1 is outside" "$BIN" regress --baseline "$TMP/neg.json"
check "regress baseline with T*K overflowing" 2 "--baseline: T\*K" "$BIN" regress --baseline "$TMP/bigT.json"

# ---- issue 32: every exit status tells the truth; the last cache traps ----------------------
# 1. tune exits 1 when a candidate failed to compile or to store, with the counts and the first
#    reason, and says "compiled into the cache" only when it is so.
mkdir -p "$TMP/brokencuda/include"
echo '#error this toolkit is broken' > "$TMP/brokencuda/include/cuda_bf16.h"
# The kernel layer's kernels (_cute) reach CCCL's headers through CuTe first.
mkdir -p "$TMP/brokencuda/include/cccl/cuda/std"
echo '#error this toolkit is broken' > "$TMP/brokencuda/include/cccl/cuda/std/cassert"
if [ $gpu -eq 0 ]; then
  check "tune, broken toolkit: exit 1 with the counts and the reason" 1 "fell short: ([0-9]+) of \1 candidates failed to compile \(first: .*this toolkit is broken" env CUDA_HOME="$TMP/brokencuda" "$BIN" tune $SMALL -T 100 --candidates 2 --db "$TMP/broken.db" --quiet
  check "tune, broken toolkit: no claim that the cache has them" 1 "" bash -c "CUDA_HOME='$TMP/brokencuda' '$BIN' tune $SMALL -T 100 --candidates 2 --db '$TMP/broken.db' 2>&1 | grep 'compiled into the cache'"
  check "tune, broken toolkit: --json says so" 1 '"all_in_cache": false' env CUDA_HOME="$TMP/brokencuda" "$BIN" tune $SMALL -T 100 --candidates 2 --db "$TMP/broken.db" --json
  check "tune, healthy: says every candidate is in the cache" 0 "every candidate is compiled into the cache" "$BIN" tune $SMALL -T 100 --candidates 2 --db "$TMP/broken.db" --quiet
  # A full disk: files may not grow past 600 KiB (SIGXFSZ ignored: writes fail with EFBIG).
  check "tune, disk full: exit 1 naming the unstored count" 1 "fell short: [1-9][0-9]* compiled candidates were not stored: the cache failed \(.*$TMP/full.db" bash -c "trap '' XFSZ; ulimit -f 600; exec '$BIN' tune $SMALL --activation gelu -T 100 --candidates 1 --db '$TMP/full.db' --quiet"
  check "tune, disk full: what was stored is intact" 0 "integrity ok, [1-9][0-9]* binaries checked, 0 bad" "$BIN" cache verify --db "$TMP/full.db"
fi
# 3. Another file's -wal copied beside the cache: refused, rows intact, until verify --fix sets
#    it aside; a crash's own -wal is still recovered.
kill_mid_tune() {  # a tune into $1, killed (-9) once its -wal holds stored kernels
  "$BIN" tune $SMALL --activation relu -T 100 --candidates 3 --db "$1" --quiet >/dev/null 2>&1 &
  local pid=$! i
  for i in $(seq 600); do
    [ "$(stat -c %s "$1-wal" 2>/dev/null || echo 0)" -gt 150000 ] && break
    sleep 0.1
  done
  kill -9 $pid
  wait $pid 2>/dev/null
}
kill_mid_tune "$TMP/other.db"
check "a killed tune leaves its -wal" 0 "" test -s "$TMP/other.db-wal"
cp "$TMP/base.db" "$TMP/k.db"
cp "$TMP/other.db-wal" "$TMP/k.db-wal"  # the reproduction
cp "$TMP/k.db" "$TMP/k.orig"
check "another file's -wal: gc refuses" 1 "k.db-wal beside it is not this cache's own: it belongs to another file.*verify --fix" "$BIN" cache gc --max-mb 1048576 --db "$TMP/k.db"
check "another file's -wal: tune refuses" 1 "not this cache's own" "$BIN" tune $SMALL -T 100 --candidates 1 --db "$TMP/k.db"
check "another file's -wal: list refuses" 1 "not this cache's own" "$BIN" cache list --db "$TMP/k.db"
check "another file's -wal: verify reports it" 1 "not this cache's own" "$BIN" cache verify --db "$TMP/k.db"
check "another file's -wal: the file unchanged" 0 "" cmp "$TMP/k.db" "$TMP/k.orig"
check "another file's -wal: the -wal unchanged" 0 "" cmp "$TMP/k.db-wal" "$TMP/other.db-wal"
check "another file's -wal: verify --fix sets it aside" 0 "set aside as $TMP/k.db-wal.refused-[0-9]+.*integrity ok" bash -c "'$BIN' cache verify --fix --db '$TMP/k.db' | tr '\n' ' '"
check "another file's -wal: kept byte for byte" 0 "" bash -c "cmp '$TMP/other.db-wal' \$(ls '$TMP'/k.db-wal.refused-*)"
check "another file's -wal: rows intact" 0 "^$n0\$" rows "$TMP/k.db"
check "another file's -wal: gc works again" 0 "gc deleted 0 binaries" "$BIN" cache gc --max-mb 1048576 --db "$TMP/k.db"
check "a killed tune's own -wal is recovered" 0 "integrity ok, [1-9][0-9]* binaries checked, 0 bad" "$BIN" cache verify --db "$TMP/other.db"
check "README: copy a cache with cache export" 0 "never with cp" grep -i "copy a cache with .cache export., never with cp" "$(dirname "$0")/../../README.md"
# 4. Another user's reads leave nothing behind in a shared folder; root's verify --fix keeps
#    the owner and mode of the file it salvages.
if [ -n "$AS_OTHER" ]; then
  mkdir -p "$TMP/shared"
  chmod 1777 "$TMP/shared"
  cp "$TMP/base.db" "$TMP/shared/k.db"
  chmod 0644 "$TMP/shared/k.db"
  check "another user's show reads it" 0 "[1-9][0-9]* binaries" $AS_OTHER "$OTHER_BIN" cache show --db "$TMP/shared/k.db"
  check "another user's list reads it" 0 "winners in" $AS_OTHER "$OTHER_BIN" cache list --db "$TMP/shared/k.db"
  check "another user's verify reads it" 0 "integrity ok" $AS_OTHER "$OTHER_BIN" cache verify --db "$TMP/shared/k.db"
  check "another user's reads leave nothing beside it" 0 "^none$" bash -c "ls '$TMP/shared' | grep -E 'k[.]db-(wal|shm)' || echo none"
  check "the owner still writes its cache" 0 "gc deleted 0 binaries" "$BIN" cache gc --max-mb 1048576 --db "$TMP/shared/k.db"
  cp "$TMP/base.db" "$TMP/shared/user.db"
  python3 "$(dirname "$0")/craft_cache_files.py" damage "$TMP/shared/user.db"
  chown 65534:65534 "$TMP/shared/user.db"
  chmod 0640 "$TMP/shared/user.db"
  check "root's verify --fix salvages a user's cache" 0 "saved [1-9][0-9]* rows" "$BIN" cache verify --fix --db "$TMP/shared/user.db"
  check "the salvaged file keeps its owner and mode" 0 "^65534:65534 640$" stat -c '%u:%g %a' "$TMP/shared/user.db"
fi
# 8. A dangling symbolic link as --db or as the export target is refused, nothing created.
ln -s "$TMP/nowhere.db" "$TMP/dangling.db"
check "--db a dangling symlink: show refuses" 1 "symbolic link to $TMP/nowhere.db, which does not exist" "$BIN" cache show --db "$TMP/dangling.db"
check "--db a dangling symlink: tune refuses" 1 "symbolic link" "$BIN" tune $SMALL -T 100 --candidates 1 --db "$TMP/dangling.db"
check "--db a dangling symlink: nothing created" 1 "" test -e "$TMP/nowhere.db"
ln -s "$TMP/nowhere-export.db" "$TMP/dangling-export.db"
check "export to a dangling symlink: refused" 1 "cannot export to $TMP/dangling-export.db: File exists \(a symbolic link\)" "$BIN" cache export "$TMP/dangling-export.db" --db "$TMP/base.db"
check "export to a dangling symlink: nothing created" 1 "" test -e "$TMP/nowhere-export.db"
# 8. verify --fix deletes a cubin stored as TEXT (and says how many it deleted).
cp "$TMP/base.db" "$TMP/text.db"
python3 -c "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); c.execute('update binaries set cubin = cast(cubin as text) where rowid = (select min(rowid) from binaries)'); c.commit()" "$TMP/text.db"
check "cubin stored as TEXT: verify reports it" 1 "1 bad checksums .*stored as text" bash -c "set -o pipefail; '$BIN' cache verify --db '$TMP/text.db' | tr '\n' ' '"
check "cubin stored as TEXT: verify --fix deletes it" 0 "1 bad checksums \(1 deleted" "$BIN" cache verify --fix --db "$TMP/text.db"
check "cubin stored as TEXT: the row is gone" 0 "^$((n0 - 1))\$" rows "$TMP/text.db"
# 5. Integer options are decimal: no octal, no hex; baseline integers are read at full width.
check "-T 0100 is a hundred" 0 "T=100\$" "$BIN" plan $SMALL -T 0100
check "-E 010 is ten" 0 "^E=10 K=2" "$BIN" plan -E 010 -K 2 -d 64 -n 64 -T 8
for v in 0x40 0X40 0o100 0b1000000 64k 1e2 0x; do
  check "-T $v refused" 2 "--tokens: '$v' is not a decimal integer" "$BIN" plan $SMALL -T "$v"
done
check "tune -T 0x40 refused" 2 "--tokens: '0x40' is not a decimal integer" "$BIN" tune $SMALL -T 0x40 --db "$TMP/x.db"
check "tune --candidates 0x2 refused" 2 "--candidates: '0x2' is not a decimal integer" "$BIN" tune $SMALL -T 64 --candidates 0x2 --db "$TMP/x.db"
check "grad-check --seed 0x10 refused" 2 "--seed: '0x10' is not a decimal integer" "$BIN" grad-check $SMALL -T 8 --seed 0x10
python3 - "$(dirname "$0")/../../bench/baselines/qwen3-30b-a3b.json" "$TMP/wideE.json" "$TMP/floatT.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
wide = json.loads(json.dumps(b)); wide["layer"]["E"] = 2**32 + 128
json.dump(wide, open(sys.argv[2], "w"))
flt = json.loads(json.dumps(b)); flt["tokens"] = 32768.5
json.dump(flt, open(sys.argv[3], "w"))
PY
check "regress baseline E = 2^32 + 128 refused" 2 "--baseline: E = 4294967424 is outside \[1, 512\]" "$BIN" regress --baseline "$TMP/wideE.json"
check "regress baseline tokens = 32768.5 refused" 2 "--baseline: tokens = 32768.5 is not an integer" "$BIN" regress --baseline "$TMP/floatT.json"

# 8. --json with a --db path that is not UTF-8 still prints a valid report (the bytes replaced).
bad_db="$TMP/$(printf 'k\377')-latin1.db"
cp "$TMP/base.db" "$bad_db"
check "gc --json, --db not UTF-8: a valid report" 0 "^valid$" bash -c "'$BIN' cache gc --max-mb 1048576 --json --db '$bad_db' | python3 -c 'import json, sys; json.load(sys.stdin); print(\"valid\")'"
check "show --json, --db not UTF-8: a valid report" 0 "^valid$" bash -c "'$BIN' cache show --json --db '$bad_db' | python3 -c 'import json, sys; json.load(sys.stdin); print(\"valid\")'"
check "--db not UTF-8: rows intact" 0 "^$n0\$" rows "$bad_db"
if [ $gpu -eq 0 ]; then
  check "tune --json, --db not UTF-8: a valid report" 0 "^valid$" bash -c "'$BIN' tune $SMALL -T 100 --candidates 1 --json --db '$bad_db' | python3 -c 'import json, sys; json.load(sys.stdin); print(\"valid\")'"
fi
# 8. An unwritable --ptx-dir is refused before any kernel compiles (with a broken toolkit a
#    compile would fail first, with exit 1).
mkdir -p "$TMP/ptx_ro"
chmod 0555 "$TMP/ptx_ro"
if [ -n "$AS_OTHER" ] || [ "$(id -u)" != 0 ]; then
  check "generate --ptx-dir unwritable: refused first" 2 "--ptx-dir: cannot write in '$TMP/ptx_ro'" env CUDA_HOME="$TMP/brokencuda" $AS_OTHER "$OTHER_BIN" generate $SMALL --ptx-dir "$TMP/ptx_ro"
fi

# ---- issue 34: every --json prints one valid JSON document on stdout, in every outcome -------
# json_check NAME EXPECTED_RC PYTHON_CONDITION CMD...: stdout alone must parse as JSON, the
# exit code be the documented one, and the condition (on `j`, the parsed value) hold.
json_check() {
  local name=$1 want=$2 cond=$3; shift 3
  local out rc verdict
  out=$("$@" 2>/dev/null); rc=$?
  verdict=$(python3 -c 'import json, sys
try:
    j = json.loads(sys.stdin.read())
except ValueError as e:
    print("not JSON:", e); sys.exit()
print("ok" if eval(sys.argv[1]) else "condition false")' "$cond" <<<"$out")
  check "$name" 0 "^ok$" echo "$( [ "$rc" -eq "$want" ] && echo "$verdict" || echo "rc $rc, wanted $want: $verdict")"
  [ "$verdict" = ok ] || echo "$out" | head -20
}
BASE=$(dirname "$0")/../../bench/baselines/qwen3-30b-a3b.json
json_check "json: presets" 0 'isinstance(j, list) and any(p["name"] == "deepseek-v3" and p["E"] == 256 for p in j)' "$BIN" presets --json
json_check "json: generate --check-only" 0 'len(j["kernels"]) == 16' "$BIN" generate --check-only --preset mixtral-8x7b --json
json_check "json: generate --check-only --source" 0 'all("#include" in k["source"] for k in j["kernels"])' "$BIN" generate --check-only --source --preset mixtral-8x7b --json
json_check "json: generate" 0 'j["kernels_with_spills"] == 0 and all("registers" in k for k in j["kernels"])' "$BIN" generate $SMALL --json --quiet
json_check "json: generate --source" 0 'all("extern" in k["source"] for k in j["kernels"])' "$BIN" generate $SMALL --json --source --quiet
json_check "json: generate, illegal tile" 2 'j["error"]["kind"] == "bad_argument" and j["error"]["exit_code"] == 2' "$BIN" generate --check-only $SMALL --json --tile down_wgrad=128x128x64_w2x4_s3_wgmma
json_check "json: plan" 0 'j["save-h"]["h_floor_bytes"] == 805306368' "$BIN" plan --preset qwen3-30b-a3b --json
json_check "json: plan, preset as a positional" 0 'j["recompute"]["saved_bytes"] > 0' "$BIN" plan qwen3-30b-a3b --json
json_check "json: plan -T 0" 2 'j["error"]["argument"] == "--tokens"' "$BIN" plan qwen3-30b-a3b -T 0 --json
json_check "json: parse error" 2 '"not expected" in j["error"]["message"]' "$BIN" plan qwen3-30b-a3b --json --bogus
json_check "json: empty value" 2 '"empty value" in j["error"]["message"]' "$BIN" plan qwen3-30b-a3b --json -T ""
json_check "json: unknown preset" 2 '"unknown preset" in j["error"]["message"]' "$BIN" plan nope --json
json_check "json: regress, missing baseline" 2 'j["error"]["argument"] == "--baseline"' "$BIN" regress --baseline "$TMP/none.json" --json
"$BIN" cache gc --max-mb 1048576 --db "$TMP/empty.db" >/dev/null 2>&1  # a new, empty cache
json_check "json: cache list of an empty cache" 0 'j == []' "$BIN" cache list --json --db "$TMP/empty.db"
json_check "json: cache list" 0 'isinstance(j, list)' "$BIN" cache list --json --db "$TMP/base.db"
json_check "json: cache show" 0 'j["summary"]["binaries"] > 0' "$BIN" cache show --json --db "$TMP/base.db"
json_check "json: cache verify" 0 'j["verify"]["integrity_ok"]' "$BIN" cache verify --json --db "$TMP/base.db"
json_check "json: cache verify, damaged" 1 'j["verify"]["integrity_ok"] is False' "$BIN" cache verify --json --db "$TMP/damaged.orig"
json_check "json: cache export" 0 'j["exported_to"].endswith("j-export.db")' "$BIN" cache export "$TMP/j-export.db" --json --db "$TMP/base.db"
json_check "json: cache export, exists" 1 'j["error"]["kind"] == "failure"' "$BIN" cache export "$TMP/j-export.db" --json --db "$TMP/base.db"
json_check "json: cache import" 0 'j["imported_rows"] > 0' "$BIN" cache import "$TMP/j-export.db" --json --db "$TMP/j-import.db"
json_check "json: cache gc" 0 'j["gc_deleted"] == 0' "$BIN" cache gc --max-mb 1048576 --json --db "$TMP/base.db"
json_check "json: cache gc, bad cap" 2 'j["error"]["argument"] == "--max-mb"' "$BIN" cache gc --max-mb -1 --json --db "$TMP/base.db"
json_check "json: cache, not a database" 1 '"not an SQLite database" in j["error"]["message"]' "$BIN" cache show --json --db "$TMP/corrupt.db"
json_check "json: tune, bad argument" 2 'j["error"]["argument"] == "--candidates"' "$BIN" tune $SMALL -T 64 --candidates 0 --json --db "$TMP/x.db"
if [ $gpu -eq 0 ]; then
  json_check "json: tune without a GPU" 0 'j["timed"] is False and j["families"] == [] and j["all_in_cache"]' "$BIN" tune $SMALL -T 100 --candidates 1 --json --db "$TMP/t.db"
  json_check "json: tune --baseline-out without a GPU" 3 'j["error"]["kind"] == "no_gpu"' "$BIN" tune $SMALL -T 100 --candidates 1 --json --db "$TMP/t.db" --baseline-out "$TMP/b.json"
  check "tune --baseline-out without a GPU: refused before compiling" 3 "needs timings" "$BIN" tune $SMALL --activation silu -T 100 --candidates 1 --db "$TMP/nobase.db" --baseline-out "$TMP/b.json"
  check "tune --baseline-out without a GPU: nothing compiled" 1 "" test -e "$TMP/nobase.db"
  json_check "json: regress without a GPU" 0 'j["skipped"] is True and j["kernels"] == [] and j["baseline_kernels"] > 0' "$BIN" regress --baseline "$BASE" --json
  NO_GPU='j["error"] == {"kind": "no_gpu", "exit_code": 3, "message": j["error"]["message"]} and "needs a GPU" in j["error"]["message"]'
  json_check "json: forward-check without a GPU" 3 "$NO_GPU" "$BIN" forward-check $SMALL -T 64 --json
  json_check "json: grad-check without a GPU" 3 "$NO_GPU" "$BIN" grad-check $SMALL -T 64 --json
  json_check "json: bench without a GPU" 3 "$NO_GPU" "$BIN" bench $SMALL -T 64 --json
else
  json_check "json: forward-check" 0 'j["passed"] and j["errors"]' "$BIN" forward-check $SMALL -T 100 --json
  json_check "json: grad-check" 0 'j["passed"] and j["errors"]' "$BIN" grad-check $SMALL -T 100 --json
  json_check "json: bench" 0 'j["step_ms"] > 0 and j["kernels"]' "$BIN" bench $SMALL -T 1000 --db "$TMP/t.db" --json
  json_check "json: tune" 0 'j["timed"] and j["families"]' "$BIN" tune $SMALL -T 1000 --candidates 2 --json --db "$TMP/t.db" --baseline-out "$TMP/gpu-base.json"
  json_check "json: regress" 0 'j["skipped"] is False' "$BIN" regress --baseline "$TMP/gpu-base.json" --json
fi
# Every subcommand with --json appears above.
for c in presets generate plan forward-check grad-check tune bench regress; do
  check "json: $c is covered" 0 "" grep -q "json_check \"json: $c" "$0"
done
for c in list show verify export import gc; do
  check "json: cache $c is covered" 0 "" grep -q "json_check \"json: cache $c" "$0"
done

# ---- issue 34: a preset as a positional, -T 0, progress ---------------------------------------
check "preset as a positional" 0 "^E=128 K=8 d=2048 n=768 .*T=32768" "$BIN" plan qwen3-30b-a3b
check "preset twice" 2 "--preset: give the preset once" "$BIN" plan qwen3-30b-a3b --preset mixtral-8x7b
check "positional preset and a shape" 2 "not both" "$BIN" plan qwen3-30b-a3b -E 8
check "-T 0 is refused, not the preset's T" 2 "--tokens: T = 0 must be positive" "$BIN" plan --preset qwen3-30b-a3b -T 0
check "grad-check -T 0 refused" 2 "--tokens: T = 0" "$BIN" grad-check qwen3-30b-a3b -T 0
check "generate -T 0 refused" 2 "--tokens: T = 0" "$BIN" generate --check-only qwen3-30b-a3b -T 0
# Progress on a terminal: a count of the compiles with an estimate (script(1) gives a pty).
if command -v script >/dev/null; then
  check "generate on a terminal: a count and an estimate" 0 "compiled [0-9]+ of [0-9]+ kernels, [0-9]+s, about [0-9]+s left" script -qec "'$BIN' generate $SMALL --activation relu" /dev/null
  check "tune on a terminal: a count of candidates" 0 "compiled [0-9]+ of [0-9]+ candidates" script -qec "'$BIN' tune $SMALL --activation relu -T 100 --candidates 2 --db '$TMP/tty.db'" /dev/null
fi
"$BIN" generate $SMALL --activation geglu 2>"$TMP/phases.txt" >/dev/null
check "generate, not a terminal: one line a phase" 0 "^compiling [0-9]+ kernels of E=8 K=2 d=64 n=64 geglu .*NVRTC$" head -n 1 "$TMP/phases.txt"
check "generate, not a terminal: the last says how long" 0 "^compiled ([0-9]+) of \\1 kernels, [0-9]+s$" tail -n 1 "$TMP/phases.txt"
check "generate, not a terminal: no counts between" 0 "^2$" bash -c "wc -l < '$TMP/phases.txt'"
check "generate --quiet: nothing on stderr" 0 "^$" bash -c "'$BIN' generate $SMALL --quiet 2>&1 >/dev/null"

# ---- the argument space, fuzzed (seeded; the seed is printed) --------------------------------
check "CLI argument fuzz" 0 "fuzz: [0-9]+ runs, all exit codes documented" python3 "$(dirname "$0")/fuzz_cli_args.py" "$BIN" "$TMP/fuzz" "$TMP/base.db"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

#!/usr/bin/env bash
# CLI tests (no GPU needed): every subcommand's help, outputs, exit codes and messages.
# Usage: run_cli_tests.sh PATH_TO_MOEBLAZE
set -u
BIN=$1
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

check "help" 0 "generate" "$BIN" --help
for c in presets generate forward-check grad-check; do
  check "$c --help" 0 "Usage|Options" "$BIN" "$c" --help
done
check "version" 0 "moeblaze [0-9]" "$BIN" --version
check "presets" 0 "qwen3-30b-a3b .*\[suite\]" "$BIN" presets
check "presets --json" 0 '"name": "deepseek-v3", "E": 256' "$BIN" presets --json
check "generate preset" 0 "16 kernels compiled, 0 with spills" "$BIN" generate --preset olmoe-1b-7b
check "generate json" 0 '"kernels_with_spills": 0' "$BIN" generate -E 8 -K 2 -d 64 -n 64 --json
check "generate plain activation" 0 "0 with spills" "$BIN" generate -E 8 -K 2 -d 64 -n 64 --activation gelu
check "unknown preset" 2 "unknown preset 'nope'" "$BIN" generate --preset nope
check "K > E" 2 "topk: K = 8 is larger than E = 4" "$BIN" generate -E 4 -K 8 -d 64 -n 64
check "d not multiple of 8" 2 "hidden: d = 100 must be a positive multiple of 8" "$BIN" generate -E 4 -K 2 -d 100 -n 64
check "E = 0" 2 "experts" "$BIN" generate -E 0 -K 1 -d 64 -n 64
check "missing ffn" 2 "--ffn: missing" "$BIN" generate -E 4 -K 2 -d 64
check "preset and shape" 2 "not both" "$BIN" generate --preset mixtral-8x7b -E 4
check "bad activation" 2 "activation" "$BIN" generate -E 4 -K 2 -d 64 -n 64 --activation swish
check "bad mode" 2 "mode: 'fast'" "$BIN" grad-check -E 4 -K 2 -d 64 -n 64 -T 8 --mode fast
check "T = 0" 2 "tokens|--tokens" "$BIN" forward-check -E 4 -K 2 -d 64 -n 64 -T -1
check "skewed with router" 2 "--routing" "$BIN" grad-check --preset qwen3-30b-a3b --routing skewed
if [ $gpu -eq 0 ]; then
  check "forward-check without GPU" 3 "needs a GPU" "$BIN" forward-check -E 4 -K 2 -d 64 -n 64 -T 8
  check "grad-check without GPU" 3 "needs a GPU" "$BIN" grad-check -E 4 -K 2 -d 64 -n 64 -T 8
else
  check "forward-check small" 0 "PASS" "$BIN" forward-check -E 8 -K 2 -d 64 -n 64 -T 100
  check "grad-check small" 0 "PASS" "$BIN" grad-check -E 8 -K 2 -d 64 -n 64 -T 100 --router none --routing skewed
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

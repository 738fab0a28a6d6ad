#!/usr/bin/env bash
# CTest "sass" (no GPU): bench/sass.py on a kernel NVRTC compiles here. One kernel-layer
# down_proj is compiled into a scratch cache, disassembled by nvdisasm (the
# nvidia-cuda-nvdisasm wheel scripts/setup.sh installs) and read by `loops`: its consumer
# k-loop must hold wgmma (HGMMA) instructions and its producer loop the TMA loads (UTMALDG).
# Exit 77 (skipped) where nvdisasm is not installed.
# Usage: tests/sass/sass_end_to_end.sh MOEBLAZE_BINARY
set -eu
BIN=$1
cd "$(dirname "$0")/../.."
python3 -c 'import sys; sys.path.insert(0, "bench"); import sass; sass.nvdisasm_path()' >/dev/null 2>&1 || {
  echo "sass: no nvdisasm (pip install nvidia-cuda-nvdisasm): skipped"; exit 77; }
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
"$BIN" generate --preset qwen3-30b-a3b -T 32768 --quiet --db "$OUT/c.db" \
  --tile down_proj=128x128x64_w4x1_s6_pingpong_tmacontig_tmastore_cute > "$OUT/gen.log" 2>&1 || { cat "$OUT/gen.log"; exit 1; }
python3 bench/sass.py cache "$OUT/c.db" --kernel 'mb_down_proj_%_cute' --out "$OUT/sass"
python3 bench/sass.py loops "$OUT"/sass/*.sass --opcodes HGMMA,UTMALDG | tee "$OUT/loops.txt"
# Columns: instrs HGMMA UTMALDG. A loop with wgmmas and one with TMA loads.
awk 'NR > 2 && $2 > 0 { mma = 1 } NR > 2 && $3 > 0 { tma = 1 } END { exit !(mma && tma) }' "$OUT/loops.txt" || {
  echo "sass: no loop with HGMMA and none with UTMALDG in the down_proj kernel"; exit 1; }
echo "sass: end to end ok"

#!/usr/bin/env bash
# Session seven, device call 6 (the budget's last minutes): down_dgrad's persistent 128x256 tile
# in the other schedule order (`_swap`: M tiles outer inside an expert, so the blocks in flight
# share gathered dy rows instead of a W2 column tile) against the default order, whose L2 hit
# rate call 5 measured at 69% (mixtral) / 78% (gpt-oss), against up_proj's 77%.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MOEBLAZE_CACHE=/tmp/moeblaze-cache.db
for p in mixtral-8x7b gpt-oss-20b deepseek-v3; do
  for t in 128x256x64_w8x1_s4_wsp_tma_swap 128x256x64_w8x1_s4_wsp_tma; do
    echo "$p $t: $(timeout 60 build/bin/moeblaze bench --preset $p --no-cache --tile down_dgrad=$t 2>&1 | grep -E '^ *down_dgrad |step ' | tr -s ' ' | tr '\n' ' ')"
  done
done

#!/usr/bin/env bash
# Session seven, device call 7 (the budget's last minutes): down_dgrad's time split. Three
# builds of the same kernels: main (build/), the mainloop and the gate lookups without the
# epilogue (build-ne), the mainloop alone (build-ng) -- branch wip/dgrad-noepi, wrong results,
# timing only. up_proj (same gathered rows, same tile size) in the same benches for reference.
set -u
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} MOEBLAZE_CACHE=/tmp/moeblaze-cache.db
run() {  # build preset
  echo "$1 $2: $(timeout 60 $1/bin/moeblaze bench --preset $2 --no-cache 2>&1 | grep -E '^ *(down_dgrad|up_proj) ' | tr -s ' ' | tr '\n' ' ')"
}
for p in mixtral-8x7b gpt-oss-20b; do for b in build build-ne build-ng; do run $b $p; done; done
run build-ne deepseek-v3

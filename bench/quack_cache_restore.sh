#!/usr/bin/env bash
# Restores SonicMoE's QuACK kernels that an earlier run compiled (the quack_cache_new.tgz that
# bench/run_suite.sh writes) into the unpacked peer's cache. SonicMoE's payload lacks ~30 of the
# QuACK kernels its backward needs, and its first backward compiles them (2-3.5 minutes on an
# H200 machine); with them restored it starts at once.
# Usage: bench/quack_cache_restore.sh FILE
# Environment: MOEBLAZE_PEERS (default .peers), SONIC_SITE (where the peer unpacks, default
# /tmp/sonic-site). Unpacks the peer first (its install.sh does nothing when it is unpacked).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -ne 1 ] || [ ! -f "$1" ]; then
  echo "quack_cache_restore: ${1:-no file given}: not a file (a quack_cache_new.tgz of an earlier run)" >&2
  exit 2
fi
PEERS=${MOEBLAZE_PEERS:-$PWD/.peers}
SONIC_SITE=${SONIC_SITE:-/tmp/sonic-site}
if [ ! -d "$PEERS/sonicmoe" ]; then
  echo "quack_cache_restore: no $PEERS/sonicmoe: nothing to restore into" >&2
  exit 2
fi
bash "$PEERS/sonicmoe/install.sh" "$SONIC_SITE" >/dev/null
mkdir -p "$SONIC_SITE/quack_cache"
tar xzf "$1" -C "$SONIC_SITE/quack_cache"
echo "quack_cache_restore: restored $(tar tzf "$1" | wc -l) QuACK cache files into $SONIC_SITE/quack_cache" >&2

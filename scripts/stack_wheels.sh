#!/usr/bin/env bash
# Downloads the torchtitan and megatron-core wheels the adapter tests use (the versions
# scripts/setup.sh installs, without their dependencies) into build-wheels/, for a GPU machine
# that reaches no package registry: carry build-wheels/ and tests/gpu/device_hf.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip download -q --no-deps -d build-wheels "torchtitan==0.3.0" "spmd_types==0.2.3" \
  "megatron-core==0.16.1" "tyro==1.0.17" "docstring_parser==0.18.0" "typeguard==4.6.1"
ls build-wheels

#!/usr/bin/env bash
# Downloads the torchtitan and megatron-core wheels the adapter tests use (the versions
# scripts/setup.sh installs, without their dependencies) into build-wheels/, for a GPU machine
# that reaches no package registry: carry build-wheels/ and tests/gpu/device_hf.sh installs them.
set -euo pipefail
cd "$(dirname "$0")/.."
# megatron-core has compiled parts: fetch the build for the GPU machine's Python
# (MOEBLAZE_GPU_PYTHON, default 3.12: the H200 image's), not this machine's.
py=${MOEBLAZE_GPU_PYTHON:-3.12}
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d build-wheels "torchtitan==0.3.0" "spmd_types==0.2.3" \
  "megatron-core==0.16.1" "tyro==1.0.17" "docstring_parser==0.18.0" "typeguard==4.6.1"
ls build-wheels

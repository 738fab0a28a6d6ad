#!/usr/bin/env bash
# The test command: set up, build, run every test (CPU tests, CLI tests, the Python package's
# tests, and the GPU tests, which CTest reports as skipped when no GPU is present), then check
# the Python wheel of the library just built: tag, files and symbols, installed into a fresh
# virtual environment with its NVIDIA packages and no CUDA toolkit in sight, a preset's kernels
# compiled from it, the Python tests against it (scripts/wheel.sh --from-build: nothing is
# compiled twice). Extra arguments go to ctest, e.g. `scripts/test.sh -L cpu`.
# MOEBLAZE_SKIP_PIP=1 skips the wheel check.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# -V streams every test's own progress as it runs (a line per doctest case and per CLI check,
# pytest's dots): the whole run takes many minutes.
ctest --test-dir "${MOEBLAZE_BUILD_DIR:-build}" --output-on-failure -V "$@"
if [ "${MOEBLAZE_SKIP_PIP:-0}" != 1 ]; then
  scripts/wheel.sh --from-build "${MOEBLAZE_BUILD_DIR:-build}"
fi

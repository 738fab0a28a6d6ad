#!/usr/bin/env bash
# The test command: set up, build, run every test (CPU tests, CLI tests, and the GPU tests,
# which CTest reports as skipped when no GPU is present). Extra arguments go to ctest,
# e.g. `scripts/test.sh -L cpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${MOEBLAZE_BUILD_DIR:-build}" --output-on-failure "$@"

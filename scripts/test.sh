#!/usr/bin/env bash
# The test command: set up, build, run every test (CPU tests, CLI tests, the Python package's
# tests, and the GPU tests, which CTest reports as skipped when no GPU is present), then check
# that `pip install ./python` builds and imports in a fresh virtual environment.
# Extra arguments go to ctest, e.g. `scripts/test.sh -L cpu`. MOEBLAZE_SKIP_PIP=1 skips the
# package build.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# -V streams every test's own progress as it runs (a line per doctest case and per CLI check,
# pytest's dots): the whole run takes many minutes.
ctest --test-dir "${MOEBLAZE_BUILD_DIR:-build}" --output-on-failure -V "$@"
if [ "${MOEBLAZE_SKIP_PIP:-0}" != 1 ]; then
  venv=$(mktemp -d)
  trap 'rm -rf "$venv"' EXIT
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q ./python pytest
  (cd "$venv" && "$venv/bin/python" -m pytest -q -p no:cacheprovider "$OLDPWD/python/tests")
fi

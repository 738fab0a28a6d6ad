#!/usr/bin/env bash
# The CPU tests run as one CTest per source file (-sf=*/FILE.cpp, CMakeLists.txt): every test
# case of the program must be in one of those files (a TEST_CASE in a header would run in none).
# Usage: cpu_cases_covered.sh PROGRAM FILE.cpp...
set -u
prog=$1; shift
count() { "$prog" "$@" --count 2>&1 | sed -n 's/.*passing the current filters: \([0-9]*\).*/\1/p'; }
total=$(count)
sum=0
for f in "$@"; do sum=$((sum + $(count "-sf=*/$f"))); done
echo "$sum of $total test cases are in the per-file CTests ($# files)"
[ -n "$total" ] && [ "$total" -gt 0 ] && [ "$sum" -eq "$total" ]

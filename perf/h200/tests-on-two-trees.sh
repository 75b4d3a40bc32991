#!/usr/bin/env bash
# tests-on-two-trees.sh - the same real-driver tests built from two trees, to show that a test fails on the older
# library and passes on the current one.  Run from the repository root on the GPU machine:
#   BASE_DIR=.deps/before TESTS='test_stream|test_buffer_streams' OUT=/some/dir perf/h200/tests-on-two-trees.sh
# BASE_DIR holds the older library with the current tests (e.g. the current tree with lib/ and include/ from
# `git archive <rev>`).  Both trees are built Release against the real driver; then `ctest -R "$TESTS"` runs in
# each.  Writes $OUT/tests-on-two-trees.txt; the last line is SUMMARY before=rc after=rc (the wanted answer: before
# non-zero, after 0).
set -u
OUT=${OUT:-/tmp/fabpool-two-trees}
BASE_DIR=${BASE_DIR:-.deps/before}
TESTS=${TESTS:?name the tests, a ctest -R pattern}
mkdir -p "$OUT"
. perf/h200/common.sh   # step NAME TIMEOUT COMMAND..., `status` and h200_build
{
  echo "tests-on-two-trees: before $BASE_DIR ($(cat "$BASE_DIR/.rev" 2>/dev/null)), after $(cat .rev 2>/dev/null || echo .)"
  nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>&1
  for side in before after; do
    src=.; [ $side = before ] && src=$BASE_DIR
    h200_build "build-$side" 300 "$src" /tmp/ba-$side
    step "$side" 300 ctest --test-dir /tmp/ba-$side -R "$TESTS" --output-on-failure --timeout 120
  done
  echo "SUMMARY ${status[*]}"
} > "$OUT/tests-on-two-trees.txt" 2>&1
tail -n 80 "$OUT/tests-on-two-trees.txt"

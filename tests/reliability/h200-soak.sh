#!/usr/bin/env bash
# Reliability tests on a real GPU (the H200): builds with the real driver and runs
# test_badinput, test_threads, test_peer_crash and a 150-second soak.  Each
# program runs whatever the others did; everything goes to $OUT/reliability-h200.txt.
# Run from the repository root: bash tests/reliability/h200-soak.sh   (about 3 minutes)
set -u
. perf/h200/common.sh   # h200_out, h200_gpu
h200_out /tmp/out reliability-h200.txt
log=$LOG
B=${B:-/tmp/b-rel}
SOAK_SECONDS=${SOAK_SECONDS:-150}
{
  echo "# fabpool reliability on the real driver, $(date -u +%FT%TZ)"
  h200_gpu
  echo "+ cmake -S . -B $B -DFABPOOL_TEST_DRIVER=real"
  cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=RelWithDebInfo 2>&1 | tail -3
  echo "+ cmake --build $B --target test_badinput test_threads test_peer_crash test_soak"
  cmake --build "$B" -j"$(nproc)" --target test_badinput test_threads test_peer_crash test_soak 2>&1 | tail -3
  fails=0
  for t in "test_badinput" "test_threads 2000" "test_peer_crash" "test_soak --seconds $SOAK_SECONDS"; do
    set -- $t
    echo "+ $B/tests/reliability/$*"
    t0=$SECONDS
    timeout $((SOAK_SECONDS + 60)) "$B/tests/reliability/$@" 2>&1 | tail -40
    rc=${PIPESTATUS[0]}
    echo "= $1: exit $rc, $((SECONDS - t0)) s"
    [ "$rc" = 0 ] || fails=$((fails + 1))
  done
  nvidia-smi --query-gpu=memory.used --format=csv 2>&1
  echo "# $fails program(s) failed"
} > "$log" 2>&1
cat "$log"

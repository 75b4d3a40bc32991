#!/bin/bash
# sleep.sh - fabpool_sleep / fabpool_wake on one H200.
# Run from the repository root; needs CUDA 13, cmake and PyTorch 2.11 in python3; about 2 minutes.
# Builds libfabpool_torch.so against the real driver, runs test_conformance (it has the copies between device and
# host NUMA memory that sleep and wake make, not measured before) and test_sleep (the C test), then
# perf/h200/sleep_check.py:
#   memory_given_back   a ~170 M parameter transformer trained a few steps with AdamW in the MemPool tag
#                       "weights" beside 1 GiB in the tag "kv"; sleep (weights offloaded, kv discarded):
#                       cuMemGetInfo shows >= 0.95 of what the two pools mapped given back
#   restored_bitwise    wake: every parameter and optimizer tensor bitwise equal at the same data_ptr
#   discarded_reported  the tag kv reported as discarded
#   losses              training goes on; losses against a never-slept run of the same seed (bitwise, else
#                       within the spread of two never-slept runs); the three loss lists are printed
#   sleep_wake_10GiB    sleep + wake of 10 GiB against torch's pinned D2H + H2D copies of 10 GiB measured in
#                       the same run (bar: at most 2x), and the time torch takes to allocate 10 GiB pinned
# Writes $OUT/sleep-h200.txt (this log) and $OUT/sleep.json.  The last lines: one PASS/FAIL per criterion,
# SLEEP-CHECK PASS|FAIL, and SUMMARY with each step's rc.
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-sleep-out sleep-h200.txt
B=build-h200
LIB="$B/adapters/torch/libfabpool_torch.so"
{
  h200_head "fabpool sleep/wake check"
  h200_torch
  step configure 90 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real
  step build 150 cmake --build "$B" -j16 --target fabpool_torch test_sleep test_conformance
  # the driver's answers, among them the copies between device and host NUMA memory that sleep and wake make
  step conformance 60 ctest --test-dir "$B" -R '^test_conformance$' --output-on-failure
  # the C test on the real driver: the fault sweep is sim-only and skips itself
  step test_sleep 60 ctest --test-dir "$B" -R '^test_sleep$' --output-on-failure
  step sleep_check 200 python3 perf/h200/sleep_check.py --lib "$LIB" --out "$OUT/sleep.json"
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
grep -E "^(PASS|FAIL) |SLEEP-CHECK|SUMMARY|^losses|^10 GiB|^model" "$LOG"

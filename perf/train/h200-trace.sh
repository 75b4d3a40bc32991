#!/bin/bash
# h200-trace.sh - records the trace of the real training benchmark on one H200 and replays it against every
# allocator.  Run from the repository root; needs CUDA 13, cmake, PyTorch 2.11 in python3,
# gzip.  About 3 minutes: configure + build (~1.5 min), one fabpool run of perf/train/train_bench.py with
# FABPOOL_TRACE set (60 steps, ~30 s), fabpool_trace on it, then fabpool_replay against fabpool,
# cudaMallocAsync, PyTorch default and PyTorch expandable_segments (each in its own process), and the
# committed synthetic trace replayed the same way for comparison.
#
# Writes under $OUT:
#   h200-trace.txt              this log (the summary and both replay tables)
#   train-h200.trace.gz         the recorded trace, gzip -9 (commit it as perf/traces/train-h200.trace.gz if
#                               under 16 MiB: the log says its size)
#   trace-summary.txt / .json   fabpool_trace of it
#   replay-train.json           fabpool_replay --json of the recorded trace
#   replay-synthetic.json       the same of perf/traces/synthetic-train.trace.gz
#   train-bench.md / .json      train_bench.py's own report of the traced run
# The last line says what passed (rc 0 each).
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-trace-out h200-trace.txt
B=build-h200
LIB="$B/adapters/torch/libfabpool_torch.so"
STEPS=${TRACE_STEPS:-60}
{
  h200_head "fabpool trace capture and replay"
  h200_torch
  step configure 90 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real
  step build 180 cmake --build "$B" -j16 --target fabpool_torch fabpool_trace fabpool_replay fabpool_bench_torch
  ls -la "$B"/libfabpool_bench_torch.so "$LIB" 2>&1
  # the training run, fabpool only, one run: the PyTorch shim records what PyTorch asked (app_alloc / app_free
  # with their streams) and what reached the pool; the trace is written at exit (the shim never destroys its pool)
  rm -f "$OUT/train.trace"
  step train 200 env FABPOOL_TRACE="$OUT/train.trace" python3 perf/train/train_bench.py --lib "$LIB" \
       --allocators fabpool --runs 1 --steps "$STEPS" --out-dir "$OUT"
  ls -la "$OUT"/train.trace* 2>&1
  step summary 60 "$B/fabpool_trace" "$OUT/train.trace"
  "$B/fabpool_trace" "$OUT/train.trace" > "$OUT/trace-summary.txt" 2>&1
  "$B/fabpool_trace" --json "$OUT/train.trace" > "$OUT/trace-summary.json" 2>&1
  gzip -9 -c "$OUT/train.trace" > "$OUT/train-h200.trace.gz"
  echo "compressed trace: $(stat -c %s "$OUT/train-h200.trace.gz") bytes (limit to commit: 16777216)"
  step replay 240 "$B/fabpool_replay" "$OUT/train-h200.trace.gz" \
       --allocators fabpool,cudaMallocAsync,torch_default,torch_expandable --check --json "$OUT/replay-train.json"
  step replay_synthetic 120 "$B/fabpool_replay" perf/traces/synthetic-train.trace.gz \
       --allocators fabpool,cudaMallocAsync,torch_default,torch_expandable --check --json "$OUT/replay-synthetic.json"
  rm -f "$OUT/train.trace"   # the .gz holds it
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
tail -n 40 "$LOG"

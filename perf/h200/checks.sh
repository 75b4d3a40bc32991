#!/bin/bash
# checks.sh - one device call's worth of checks on the H200 (run from the repository root; CUDA 13, cmake,
# PyTorch 2.11 in python3; about 8 minutes).  Builds the tree once (Release, real driver, build-h200/), then:
#   tests        the whole ctest suite against the real driver (-j4: real-driver tests that need the device's
#                memory take a CTest resource lock)
#   sleep        perf/h200/sleep_check.py: PyTorch weights and optimizer state slept with offload and woken
#               , 10 GiB sleep + wake against pinned copies
#   stream       fabpool_bench_stream: the stream-ordered pair against cuMemAllocAsync
#   moe          adapters/torch/test_torch_moe.py in default, fabpool and mempool modes (losses compared)
#   layout       fabpool_bench's shapes of changing sizes (mixed, activations, loguniform), every allocator
#   families     fabpool_bench's shapes the layout was not tuned to (FIFO, growth by copying, Pareto sizes, drift),
#                every allocator
#   shapes       perf/torch_shapes.py: the same kind of shapes through PyTorch, fabpool installed against PyTorch's
#                default, expandable segments and cudaMallocAsync (peak used memory over peak live)
#   replay       the training benchmark on PyTorch's own allocator with its memory history recorded (40 steps),
#                made a trace by perf/snapshot_trace.py and replayed against every allocator by fabpool_replay
# CHECKS=tests,sleep,... picks some.  Writes under $OUT: checks.txt (this log), ctest.txt, sleep.json,
# stream-bench.json, moe-*.json, layout-bench.*, families-bench.*, replay.txt, replay.json; the last line is
# SUMMARY name=rc ...
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-checks checks.txt
B=build-h200
LIB="$B/adapters/torch/libfabpool_torch.so"
CHECKS=${CHECKS:-tests,sleep,stream,moe}
want() { [[ ",$CHECKS," == *",$1,"* ]]; }
{
  h200_head "fabpool checks"
  step configure 90 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release
  step build 240 cmake --build "$B" -j16
  if want tests; then
    step tests 300 bash -c "ctest --test-dir '$B' -j4 --output-on-failure --timeout 240 > '$OUT/ctest.txt' 2>&1; rc=\$?; \
      grep -E 'tests passed|Failed|Not Run|\\*\\*\\*' '$OUT/ctest.txt' | tail -n 25; exit \$rc"
  fi
  want sleep && step sleep 200 python3 perf/h200/sleep_check.py --lib "$LIB" --out "$OUT/sleep.json"
  want stream && step stream 60 "$B/fabpool_bench_stream" 1000000 --json "$OUT/stream-bench.json"
  want moe && step moe 150 python3 adapters/torch/test_torch_moe.py --lib "$LIB" --steps 200 \
       --modes default,fabpool,mempool --workdir "$OUT"
  want layout && step layout 300 bash -c "'$B/fabpool_bench' --workload mixed,activations,loguniform \
       --json '$OUT/layout-bench.json' > '$OUT/layout-bench.txt' 2>&1; rc=\$?; tail -n 60 '$OUT/layout-bench.txt'; exit \$rc"
  want families && step families 420 bash -c "'$B/fabpool_bench' --workload families \
       --json '$OUT/families-bench.json' > '$OUT/families-bench.txt' 2>&1; rc=\$?; tail -n 40 '$OUT/families-bench.txt'; exit \$rc"
  want shapes && step shapes 420 python3 perf/torch_shapes.py --lib "$LIB" --json "$OUT/torch-shapes.json"
  # the snapshot and the trace are tens of MB: beside $OUT, not in it
  want replay && step replay 420 bash -c "R=/tmp/fabpool-replay; rm -rf \$R; mkdir -p \$R; \
       { python3 perf/train/train_bench.py --allocators default --runs 1 --steps 40 --memory-history 5000000 \
           --out-dir \$R && python3 perf/snapshot_trace.py \$R/snapshot-default-0.pickle \$R/train.trace.gz && \
         '$B/fabpool_replay' --sample 1 --json '$OUT/replay.json' \$R/train.trace.gz; } > '$OUT/replay.txt' 2>&1; \
       rc=\$?; tail -n 30 '$OUT/replay.txt'; exit \$rc"
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
tail -n 60 "$LOG"

#!/bin/bash
# stream-check.sh - the stream-ordered pair and the PyTorch adapter on it (the shim without stream lists of
# its own), on one H200.  Run from the repository root; needs CUDA 13, cmake and
# PyTorch 2.11 in python3.  About 3 minutes: configure + build (~1.5 min), then
#   tests     ctest against the real driver: test_stream (skips its sim-only checks), test_buffers,
#             test_buffer_contract, test_alloc, test_torch_shim, test_torch_python
#   bench     fabpool_bench_stream: ns per alloc+free pair for fabpool_alloc/free (hot path), the pair on one
#             stream (256 B, 16 MiB), cuMemAllocAsync/cuMemFreeAsync on one stream, and allocated on s2 /
#             freed on s1 (one event recorded and queried per pair); JSON in stream-bench.json
#   hotpath   fabpool_bench --quick latency cases (the 15 ns hot path must not have moved)
#   moe       adapters/torch/test_torch_moe.py, 200 steps on two streams, default vs fabpool vs mempool:
#             bitwise the same digests, no illegal memory access (the failure of the earlier shim that freed
#             straight into the pool)
# Writes under $OUT: stream-h200.txt (this log), stream-bench.json, moe-*.json.  The last line says what
# passed (rc 0 each).
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-stream-out stream-h200.txt
B=build-h200-stream
LIB="$B/adapters/torch/libfabpool_torch.so"
{
  h200_head "fabpool stream check"
  step configure 90 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release
  step build 180 cmake --build "$B" -j16
  step tests 120 ctest --test-dir "$B" --output-on-failure \
       -R '^(test_stream|test_buffers|test_buffer_contract|test_alloc|test_torch_shim|test_torch_python)$'
  step bench 60 "$B/fabpool_bench_stream" 1000000 --json "$OUT/stream-bench.json"
  step hotpath 120 "$B/fabpool_bench" --quick --workload latency --no-torch
  step moe 150 python3 adapters/torch/test_torch_moe.py --lib "$LIB" --steps 200 --modes default,fabpool,mempool \
       --workdir "$OUT"
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
tail -n 40 "$LOG"

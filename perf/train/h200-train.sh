#!/bin/bash
# h200-train.sh - PyTorch training with fabpool on one H200.
# Run from the repository root; needs CUDA 13, cmake, PyTorch 2.11 and Lightning in python3.
# Builds the project against the real driver, then runs:
#   bench      perf/train/train_bench.py: PyTorch default, expandable_segments and fabpool, 3 runs of each
#              interleaved, 50 steps a run (about 2 min: 55 ms a step with flash attention, plus each run's start
#              of about 8 s); TRAIN_SDPA=auto lets PyTorch pick cuDNN's attention (180 ms a step, CPU-bound)
#   stats      adapters/torch/test_torch_stats.py: torch.cuda's statistics with install(stats=True) against
#              the sum of live tensor storages and the driver's free memory
#   lightning  perf/train/lightning_check.py: an unmodified Lightning script with fabpool installed, memory
#              logged by DeviceStatsMonitor
#   moe        adapters/torch/test_torch_moe.py in the MemPool mode (and the default allocator to compare)
# Writes everything under $OUT: train-h200.txt (this log), train-bench.md / .json (the table and every run),
# losses-<allocator>-<run>.txt, torch-stats.json, lightning/, moe-*.json.  Never stops at the first failure;
# the last line says what passed (rc 0 each).  TRAIN_CHECKS=bench,stats,... picks some (default: all four);
# TRAIN_ALLOCATORS the bench's allocators (default default,expandable,fabpool; fabpool-queue: stream_owner:0;
# fabpool-local: handle_type:none, the C++ allocator's pools without POSIX fd handles).
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-train-out train-h200.txt
B=build-h200
LIB="$B/adapters/torch/libfabpool_torch.so"
STEPS=${TRAIN_STEPS:-50}
RUNS=${TRAIN_RUNS:-3}
CHECKS=${TRAIN_CHECKS:-bench,stats,lightning,moe}
want() { [[ ",$CHECKS," == *",$1,"* ]]; }
{
  h200_head "fabpool training check"
  h200_torch
  python3 -c 'import pynvml; print("pynvml", getattr(pynvml, "__version__", "present"))' 2>&1 | tail -1
  step configure 90 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real
  step build 180 cmake --build "$B" -j16
  want bench && step bench 240 python3 perf/train/train_bench.py --lib "$LIB" --runs "$RUNS" --steps "$STEPS" --out-dir "$OUT" \
       --allocators "${TRAIN_ALLOCATORS:-default,expandable,fabpool}" --sdpa "${TRAIN_SDPA:-flash}"
  want stats && step stats 90 python3 adapters/torch/test_torch_stats.py --lib "$LIB" --out "$OUT/torch-stats.json"
  want lightning && step lightning 150 python3 perf/train/lightning_check.py --lib "$LIB" --out-dir "$OUT/lightning"
  want moe && step moe 150 python3 adapters/torch/test_torch_moe.py --lib "$LIB" --steps 100 --modes default,mempool \
       --workdir "$OUT"
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
tail -n 40 "$LOG"

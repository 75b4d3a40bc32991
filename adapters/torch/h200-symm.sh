#!/bin/bash
# h200-symm.sh - fabpool_torch.SymmetricBuffer on the real driver (one H200): 4 ranks of a gloo group on
# the one GPU, each mapping the others' buffers through POSIX fds; 200 random resizes between 1 MiB and
# 1 GiB with every rank's data read through every peer's tensors after each, two CUDA graphs captured at
# the start replayed at every step, the resize time against a new torch.distributed._symmetric_memory
# buffer and against a new fabpool buffer with a full exchange, and nothing held after close
# (adapters/torch/test_symm_gpu.py says what each phase checks).  Run from the repository root; about
# 2 minutes.  Writes $OUT/symm-h200.txt and $OUT/symm-h200.json; the last lines say what passed.
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-symm-out symm-h200.txt
# PyTorch's symmetric memory: several ranks on one device, NVLink multicast off
export TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
B=${FABPOOL_TORCH_BUILD:-/tmp/b-symm}
{
  h200_head "fabpool symmetric memory H200 check"
  h200_torch
  step configure 60 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFABPOOL_WERROR=ON
  step build 120 cmake --build "$B" -j16 --target fabpool_torch
  step symm 210 python3 adapters/torch/test_symm_gpu.py --lib "$B/adapters/torch/libfabpool_torch.so" --ranks 4 \
       --devices 1 --steps 200 --min-mib 1 --max-mib 1024 --budget-s 40 --out "$OUT/symm-h200.json"
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
tail -n 30 "$LOG"

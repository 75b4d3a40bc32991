#!/usr/bin/env bash
# On a 2-GPU H200 machine (nvidia-h200-x2): build with the project's CMake
# against the real driver, print the GPUs and their topology, run the two
# two-GPU tests, peer_bw and the symmetric-memory test (one rank per GPU),
# and ask the real driver the one question the simulated one answers by
# assumption (a write from a device without access).  Everything goes to
# $OUT/multigpu-h200x2.txt, peer_bw's figures to $OUT/peer_bw-h200x2.json,
# the symmetric memory's to $OUT/symm-h200x2.json.  It never stops at the
# first failure; each step says what it ran and its exit code.  About 4 minutes.
#
# NVLink multicast stays off on that machine: the variables below say so to
# NCCL, PyTorch and NVSHMEM (none of which this runs), and nothing here calls
# cuMulticastCreate (checked below before anything runs).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/opt/torch/.venv/bin:$PATH
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee "$OUT/multigpu-h200x2.txt") 2>&1

run() { # run <seconds> <command...>: prints the command, its output and its rc
  local t=$1; shift
  echo; echo "\$ $*"
  timeout "$t" "$@"; local rc=$?
  echo "[rc=$rc$([ $rc = 124 ] && echo ', timed out')]"
  return 0
}

# build what is committed when git is here (others may be editing the tree)
SRC=$PWD
if git rev-parse HEAD >/dev/null 2>&1; then
  rm -rf /tmp/src-mgpu && mkdir -p /tmp/src-mgpu && git archive HEAD | tar -x -C /tmp/src-mgpu && SRC=/tmp/src-mgpu
  echo "source: commit $(git rev-parse --short HEAD)"
else
  echo "source: working tree (no git)"
fi
echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
date -u
run 30 nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,memory.used --format=csv
run 30 nvidia-smi topo -m
run 30 nvidia-smi nvlink -s -i 0
echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"

if grep -rn "cuMulticast" "$SRC/lib" "$SRC/tests/multigpu" "$SRC/include" >/dev/null 2>&1; then
  echo "REFUSED: cuMulticast* appears in the sources; NVLink multicast must stay off on this machine"
  grep -rn "cuMulticast" "$SRC/lib" "$SRC/tests/multigpu" "$SRC/include"
  exit 1
fi
echo "no cuMulticast* call in lib/, include/, tests/multigpu/"

B=/tmp/b-mgpu
echo; echo "\$ cmake -S $SRC -B $B -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release"
cmake -S "$SRC" -B "$B" -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release >/tmp/cmake-mgpu.log 2>&1
echo "[rc=$?]"; grep -iE "error:|CMake Error|CUDAToolkit" /tmp/cmake-mgpu.log | head -5
echo "\$ cmake --build $B -j16 --target test_two_gpus_one_process test_two_gpus_two_processes peer_bw fabpool_torch"
cmake --build "$B" -j16 --target test_two_gpus_one_process test_two_gpus_two_processes peer_bw fabpool_torch \
  >/tmp/build-mgpu.log 2>&1
echo "[rc=$?]"; grep -E "error:|warning:" /tmp/build-mgpu.log | head -20
T=$B/tests/multigpu

# 1. the tests, as ctest runs them (peer_bw --quick is the third)
run 240 ctest --test-dir "$B" -L multigpu --output-on-failure -V
# 2. peer bandwidth: 64 MiB, 256 MiB, 1 GiB, median of 20
run 180 "$T/peer_bw" --runs 20 --sizes 64,256,1024 --json "$OUT/peer_bw-h200x2.json"
[ -f "$OUT/peer_bw-h200x2.json" ] && { echo "peer_bw JSON:"; cat "$OUT/peer_bw-h200x2.json"; }
# 3. symmetric memory, one rank per GPU (peers through NVLink): 200 random resizes between 1 MiB and 1 GiB,
#    every peer's buffer read through peer() tensors, CUDA graphs captured at the start replayed at every step,
#    the resize time against a new torch.distributed._symmetric_memory buffer, nothing held after close
#    (adapters/torch/test_symm_gpu.py)
run 200 python3 "$SRC/adapters/torch/test_symm_gpu.py" --lib "$B/adapters/torch/libfabpool_torch.so" --ranks 2 \
  --devices 2 --steps 200 --min-mib 1 --max-mib 1024 --budget-s 40 --out "$OUT/symm-h200x2.json"
# 4. what the real driver answers to a memset issued on GPU 1 into GPU 0
#    memory that GPU 1 has no access to (the sim: CUDA_ERROR_INVALID_VALUE);
#    last, in a process of its own, since a fault may spoil its context
run 60 "$T/test_two_gpus_one_process" --probe-no-access
run 30 nvidia-smi --query-gpu=index,memory.used --format=csv
echo; echo "done: $(date -u)"

#!/bin/bash
# held-check.sh - the real-driver tests on a GPU that another process uses (run from the repository root on a
# GPU machine: CUDA 13, cmake, gcc, PyTorch in python3; about 3 minutes).
#   probe     tests/probe/nvml_probe.c: the device's used memory, NVML's count for this process and held.h's
#             reading after create, map, release, unmap with an fd open, a child's import, a child's allocation
#   hog       a PyTorch process that allocates and frees 1-24 GiB at random, all the time, beside the tests
#   tests     the whole ctest suite, real driver, -j4 (the driver tests one at a time: the device lock), beside
#             the hog: each test reads the device less what NVML says the other processes use (tests/held.h)
#   nonvml    a few tests again with FABPOOL_TEST_NO_NVML=1 (the whole device's free memory, as before): they
#             are expected to fail beside the hog, which shows what held.h is for
#   moe       adapters/torch/test_torch_moe.py beside the hog (held.py: this process's use, through pynvml)
# Writes under $OUT: held.txt (this log), probe.txt, hog.txt, ctest.txt, ctest-nonvml.txt, moe-*.json.
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-held
B=build-held
{
  h200_head "held check"
  step configure 90 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release
  step build 240 cmake --build "$B" -j16
  step probe-build 60 gcc -std=c11 -D_GNU_SOURCE -O1 -I/usr/local/cuda/include tests/probe/nvml_probe.c \
    -o /tmp/nvml_probe -l:libcuda.so.1 -ldl
  step probe 60 bash -c "/tmp/nvml_probe | tee '$OUT/probe.txt'"
  rm -f /tmp/hog.stop
  python3 - > "$OUT/hog.txt" 2>&1 <<'PY' &
import os, random, time, torch
random.seed(7)
n = big = oom = 0
t0 = time.time()
while not os.path.exists("/tmp/hog.stop") and time.time() - t0 < 400:
    gib = random.randint(1, 24)
    try:
        x = torch.empty(gib << 30, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError:
        oom += 1
        time.sleep(0.05)
        continue
    x.fill_(1)
    torch.cuda.synchronize()
    time.sleep(random.uniform(0.01, 0.2))
    del x
    torch.cuda.empty_cache()
    n += 1
    big = max(big, gib)
    time.sleep(random.uniform(0.0, 0.1))
print("hog: %d allocations of 1-24 GiB (largest %d GiB), %d refused, in %.0f s" % (n, big, oom, time.time() - t0))
PY
  hog=$!
  sleep 8
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv 2>&1
  step tests 300 bash -c "ctest --test-dir '$B' -j4 --output-on-failure --timeout 240 > '$OUT/ctest.txt' 2>&1; rc=\$?; \
    grep -E 'tests passed|Failed|Not Run|\\*\\*\\*|held.h' '$OUT/ctest.txt' | tail -n 25; exit \$rc"
  step nonvml 200 bash -c "FABPOOL_TEST_NO_NVML=1 ctest --test-dir '$B' -j4 --timeout 120 \
    -R 'test_alloc\$|test_sizeclass\$|test_buffers|test_share\$|test_soak|test_sleep\$' > '$OUT/ctest-nonvml.txt' 2>&1; \
    rc=\$?; grep -E 'tests passed|Failed|\\*\\*\\*' '$OUT/ctest-nonvml.txt' | tail -n 12; exit \$rc"
  step moe 150 python3 adapters/torch/test_torch_moe.py --lib "$B/adapters/torch/libfabpool_torch.so" --steps 200 \
    --modes default,fabpool,mempool --workdir "$OUT"
  touch /tmp/hog.stop
  wait $hog
  cat "$OUT/hog.txt"
  echo "SUMMARY ${status[*]}"
} > "$OUT/held.txt" 2>&1
tail -n 70 "$OUT/held.txt"

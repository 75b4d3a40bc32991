#!/bin/bash
# h200-rl.sh - torch_memory_saver's and vLLM's CuMemAllocator's APIs on fabpool, on the real driver (one GPU).
# Run from the repository root, with .deps/torch_memory_saver (a checkout of fzyzcjy/torch_memory_saver) and
# .deps/vllm-tests (tests/basic_correctness/test_cumem.py of vllm-project/vllm) carried along.  Steps:
#   build        libfabpool_torch.so (-DFABPOOL_TEST_DRIVER=real) with the modules beside it
#   rl-compat    test_rl_compat.py (the modules' logic on a fake backend)
#   rl-gpu       test_rl_gpu.py (pause / resume, host copies, graphs, sleep / wake_up on the GPU)
#   tms-tests    torch_memory_saver's test/test_examples.py, `import torch_memory_saver` resolved to
#                fabpool_memory_saver (rl_shims.py), the tests that apply to it (TMS_TESTS below)
#   vllm-tests   vLLM's test_cumem.py, vllm.device_allocator.cumem resolved to fabpool_cumem, the tests
#                that need no model (VLLM_TESTS below)
#   tms-build    the original's hook-mode-torch library, built from the checkout with nvcc's CUDA
#   bench        perf/rl_pause_resume.py: the original beside fabpool on the same workload
#   bench-cumem  perf/rl_pause_resume.py --api cumem: vLLM's API, the staged offload beside the library's pinned one
#   uffd-turns   both benchmarks RL_TURNS times (default 2) without and with FABPOOL_STAGE_UFFD=1 in turns
#                (not in the default steps)
# RL_STEPS picks steps (default every step but uffd-turns, in the order above); what the environment sets
# (FABPOOL_STAGE_UFFD among it) holds for every step.
# Writes everything to $OUT/rl-h200.txt and the benchmarks' JSON to $OUT/rl-bench.json and
# $OUT/rl-bench-cumem.json; never stops at the first failure; the last line says what passed.
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step
h200_out /tmp/fabpool-rl-out rl-h200.txt
ROOT=$PWD
B=${FABPOOL_RL_BUILD:-/tmp/b-rl}
SH=${FABPOOL_RL_SHIMS:-/tmp/fabpool-rl-shims}
TMS=$ROOT/.deps/torch_memory_saver
VT=$ROOT/.deps/vllm-tests
LIBDIR=$B/adapters/torch
# torch_memory_saver's tests that apply (hook mode "torch"); those left out, and why:
#   every [preload] case, test_training_engine, test_cuda_vmm_granularity, test_nested_region,
#   test_cpu_backup_preload_backend_from_env: hook mode "preload" (LD_PRELOAD of cudaMalloc), not offered
#   test_disk_backup: disk backup, not offered
#   test_cpu_backup[torch], test_cpu_backup_backend_from_env[torch]: they read the original's C library
#     (_impl._binary_wrapper.cdll, _impl._mem_pools); test_rl_gpu.py checks the same public behaviour
#   the XPU tests skip themselves; the multi-device ones skip on one GPU
TMS_TESTS="test_examples.py::test_simple[torch] test_examples.py::test_cuda_graph[torch]
  test_examples.py::test_rl_example[torch] test_examples.py::test_cpu_backup_retain_from_env[torch]
  test_examples.py::test_cpu_backup_rss test_examples.py::test_multi_device[torch]
  test_examples.py::test_multi_device_torch_mode"
# vLLM's tests without a model (test_python_error in a step of its own, last: it offloads 70% of the GPU's
# memory to host memory); test_end_to_end, test_deep_sleep, test_deep_sleep_async and test_deep_sleep_fp8_kvcache
# need vLLM's engine and a model download
VLLM_TESTS="test_basic_cumem or test_cumem_with_cudagraph"
PYTEST="python3 -m pytest -q -p no:cacheprovider -rs"
build_tms() {
  local nvcc cuda major d=$SH/tms-orig
  nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null) || { echo "no nvcc: the original not built"; return 1; }
  cuda=$(dirname "$(dirname "$nvcc")")
  major=$(python3 -c 'import torch; print(torch.version.cuda.split(".")[0])')
  rm -rf "$d" && cp -r "$TMS" "$d" && cd "$d" || return 1
  g++ -std=c++17 -O3 -fPIC -shared -DUSE_CUDA=1 -DTMS_HOOK_MODE_TORCH=1 -I"$cuda/include" \
    csrc/api_forwarder.cpp csrc/core.cpp csrc/disk_backend.cpp csrc/entrypoint.cpp \
    -L"$cuda/lib64" -L"$cuda/lib64/stubs" -Wl,-rpath,"$cuda/lib64" -lcuda -lcudart -ldl \
    -o "torch_memory_saver/torch_memory_saver_hook_mode_torch_cu$major.abi3.so" && ls torch_memory_saver/*.so
}
export -f build_tms
export SH TMS
STEPS=" ${RL_STEPS:-build rl-compat rl-gpu shims tms-tests vllm-tests tms-build bench bench-cumem vllm-python-error} "
on() { [[ $STEPS == *" $1 "* ]]; }
# uffd_turns: each benchmark without and with FABPOOL_STAGE_UFFD=1, in turns, each run's JSON kept
uffd_turns() {
  local t u
  for t in $(seq 1 "${RL_TURNS:-2}"); do
    for u in 0 1; do
      step "bench-t$t-uffd$u" 120 env FABPOOL_STAGE_UFFD=$u python3 perf/rl_pause_resume.py --lib "$LIBDIR" \
        --tms "$SH/tms-orig" --json "$OUT/rl-bench-t$t-uffd$u.json"
      step "bench-cumem-t$t-uffd$u" 90 env FABPOOL_STAGE_UFFD=$u python3 perf/rl_pause_resume.py --api cumem \
        --lib "$LIBDIR" --json "$OUT/rl-bench-cumem-t$t-uffd$u.json"
    done
  done
}
{
  h200_head "fabpool RL and serving APIs"
  h200_torch
  python3 -c 'import pytest; print("pytest", pytest.__version__)' 2>&1
  on build && step build 180 bash -c "cmake -S . -B '$B' -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release \
    -DFABPOOL_WERROR=ON > '$B.log' 2>&1 && cmake --build '$B' -j16 --target fabpool_torch >> '$B.log' 2>&1 || \
    { tail -n 30 '$B.log'; exit 1; }"
  on rl-compat && step rl-compat 60 python3 adapters/torch/test_rl_compat.py "$LIBDIR"
  on rl-gpu && step rl-gpu 180 python3 adapters/torch/test_rl_gpu.py "$LIBDIR"
  on shims && step shims 30 python3 adapters/torch/rl_shims.py "$SH" "$TMS" "$VT"
  # shellcheck disable=SC2086
  on tms-tests && step tms-tests 240 bash -c "cd '$TMS/test' && PYTHONPATH='$SH/tms:$LIBDIR' $PYTEST $(echo $TMS_TESTS)"
  on vllm-tests && step vllm-tests 240 bash -c "cd '$SH/vllm' && PYTHONPATH='$SH/vllm:$LIBDIR' $PYTEST \
    tests/basic_correctness/test_cumem.py -k '$VLLM_TESTS'"
  on tms-build && step tms-build 120 bash -c build_tms
  on bench && step bench 300 python3 perf/rl_pause_resume.py --lib "$LIBDIR" --tms "$SH/tms-orig" --json "$OUT/rl-bench.json"
  on bench-cumem && step bench-cumem 120 python3 perf/rl_pause_resume.py --api cumem --lib "$LIBDIR" --json "$OUT/rl-bench-cumem.json"
  on vllm-python-error && step vllm-python-error 240 bash -c "cd '$SH/vllm' && PYTHONPATH='$SH/vllm:$LIBDIR' $PYTEST \
    tests/basic_correctness/test_cumem.py -k test_python_error"
  on uffd-turns && uffd_turns
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
tail -n 40 "$LOG"

#!/bin/bash
# h200-pytorch-tests.sh [LIB] - PyTorch's own allocator tests with PyTorch's allocator and with fabpool installed,
# on the real driver (one GPU; run from the repository root; PyTorch in python3).  The tests are PyTorch's code,
# so they are not in this repository: PYTORCH_TESTS (default .deps/pytorch-tests/test_cuda_alloc.py, an ignored
# folder) is a file of test methods taken as they are from PyTorch's test/test_cuda.py, in classes with
# upstream's settings (TestCuda's leak check), runnable as a script (run_tests()).  The selection that
# docs/results/h200-pytorch-own-tests/ names: TestCuda's test_memory_allocation, test_memory_stats,
# test_out_of_memory, test_out_of_memory_retry, test_set_per_process_memory_fraction,
# test_get_per_process_memory_fraction, test_copy_non_blocking, test_serialization_array_with_storage,
# test_cublas_workspace_explicit_allocation, test_record_stream, test_record_stream_on_shifted_view,
# test_caching_allocator_record_stream_oom, test_notifies_oom, test_allocator_fuzz; TestMemPool's
# test_mempool_empty_cache, test_mempool_no_split, test_mempool_multithread, test_mempool_emptycache_multithread,
# test_nested_mempool; TestBlockStateAbsorption's checkpoint tests and test_check_pool_live_allocations
# (test_mempool_id calls torch.accelerator.generate_graph_pool_handle, which PyTorch 2.11 lacks: left out).
# test_mempool_empty_cache and test_mempool_no_split count PyTorch's segments, which fabpool does not carve
# blocks from (one segment per block: docs/integration.md, `memory_snapshot()`), so they fail with fabpool by design.
#   build   LIB (default $B/adapters/torch/libfabpool_torch.so, B=/tmp/b-pytorch-tests) against the real driver
#           where it is not there yet
#   torch   the file in a process of its own with PyTorch's allocator
#   fabpool the same with fabpool_torch.install(LIB, mode="cxx") before any CUDA call
#   shim    TestCuda.test_out_of_memory alone with install(LIB, stats=True, mode="shim"): the shim's message read
#           by PyTorch's own regexes (the shim keeps no more of PyTorch's contract than malloc and free)
# Where the machine has no expecttest package (torch.testing._internal.common_utils takes its TestCase as a base
# class), a stand-in with that class alone is put first on the path.  Writes under $OUT: pytorch-tests.txt (this
# log), torch.txt, fabpool.txt and shim.txt (unittest's -v output).  The last line is SUMMARY name=rc ...
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-pytorch-tests pytorch-tests.txt
B=${FABPOOL_TORCH_BUILD:-/tmp/b-pytorch-tests}
LIB=$(realpath -m "${1:-$B/adapters/torch/libfabpool_torch.so}")
TESTS=$(cd "$(dirname "${PYTORCH_TESTS:-.deps/pytorch-tests/test_cuda_alloc.py}")" && pwd)/$(basename "${PYTORCH_TESTS:-test_cuda_alloc.py}")
ROOT=$PWD
SHIM=$(mktemp -d)
python3 -c 'import expecttest' 2>/dev/null || cat > "$SHIM/expecttest.py" <<'PY'
# a stand-in: common_utils' TestCase derives from this class; nothing else of the package is used here
import unittest


class TestCase(unittest.TestCase):
    longMessage = True
PY
run_tests() {   # run_tests torch|fabpool|shim
  local pre="" only=""
  case $1 in
    fabpool) pre="import sys; sys.path.insert(0, '$ROOT/adapters/torch/python'); import fabpool_torch; fabpool_torch.install('$LIB', mode='cxx'); " ;;
    shim) pre="import sys; sys.path.insert(0, '$ROOT/adapters/torch/python'); import fabpool_torch; fabpool_torch.install('$LIB', stats=True, mode='shim'); "
          only=", 'TestCuda.test_out_of_memory'" ;;
  esac
  (cd "$(dirname "$TESTS")" && PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}" python3 -c "${pre}import runpy, sys; sys.argv = ['$(basename "$TESTS")', '-v'$only]; runpy.run_path('$TESTS', run_name='__main__')") \
    > "$OUT/$1.txt" 2>&1
  local rc=$?
  grep -E "^Ran |^OK|^FAILED|^(FAIL|ERROR): " "$OUT/$1.txt"
  return $rc
}
{
  h200_head "PyTorch's own allocator tests" "tests: $TESTS, lib: $LIB"
  h200_torch
  if [ ! -f "$TESTS" ]; then
    echo "no tests at $TESTS (PYTORCH_TESTS): nothing run"; status+=("tests=missing")
  else
    [ -f "$LIB" ] || h200_build build 300 . "$B"
    export -f run_tests
    export OUT LIB TESTS ROOT SHIM
    step torch 600 bash -c "run_tests torch"
    step fabpool 600 bash -c "run_tests fabpool"
    step shim 300 bash -c "run_tests shim"
  fi
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
rm -rf "$SHIM"
tail -n 30 "$LOG"

#!/usr/bin/env bash
# On the H200: build with the project's CMake against the real driver, run the
# test suite, and look at what the machine offers the later runs (PyTorch's
# C++ side, MPI).  Everything it prints goes to $OUT/h200-tests.txt too.
set -uo pipefail
. perf/h200/common.sh   # h200_out, h200_committed_source
h200_out /tmp
exec > >(tee "$OUT/h200-tests.txt") 2>&1
h200_committed_source /tmp/src
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
cmake -S . -B /tmp/br -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release >/tmp/cmake.log 2>&1 || { cat /tmp/cmake.log; exit 1; }
cmake --build /tmp/br -j16 2>&1 | grep -E "error|warning" ; echo "build rc=${PIPESTATUS[0]}"
ctest --test-dir /tmp/br --output-on-failure -j1 -E "test_python_dlopen_jemalloc"
/tmp/br/tests/test_share -v 2>&1 | grep -iE "auto|fabric|imex|meminfo|posix" | head -20
python3 - <<'PY'
import torch, torch.utils
print("torch", torch.__version__, torch.version.cuda, "cmake prefix", torch.utils.cmake_prefix_path)
import os; inc=os.path.join(os.path.dirname(torch.__file__),"include"); print("include exists", os.path.isdir(os.path.join(inc,"c10/cuda")))
PY
which mpirun mpicc gnuplot; ls /usr/lib/x86_64-linux-gnu | grep -iE "jemalloc|libmpi" | head

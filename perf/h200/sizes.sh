#!/usr/bin/env bash
# On the H200 (one GPU, CUDA 13, cmake; run from the repo root, results under $OUT):
# the size-class / large-heap / decay work of branch `sizes` against the real driver.
#   1. test_sizeclass, every section, on the real driver (the sim-only ledger checks skip themselves):
#      the waste rule and alignment to 8 GiB, slab_max rounding, a 2 TiB + 1 GiB block (out of memory),
#      the seeded large mix (prints mapped peak / live peak and chunk maps per seed), decay timing.
#   2. fabpool_bench --workload latency and growth (hot path ns per alloc+free; growth us per step),
#      to compare with docs/performance.md (15.7 ns, 3 us): the hot path must be within 20%.
# Prints: the ctest lines and the test's own "waste:", "large seed N: ...", "decay_ms:..." lines, then
# the bench tables.  About 2 minutes.
set -uo pipefail
. perf/h200/common.sh   # h200_committed_source
exec > >(tee "${OUT:-/tmp}/h200-sizes.txt") 2>&1
h200_committed_source /tmp/src-sizes
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
cmake -S . -B /tmp/bs -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release >/tmp/cmake-sizes.log 2>&1 || { cat /tmp/cmake-sizes.log; exit 1; }
cmake --build /tmp/bs -j16 2>&1 | grep -E "error|warning"; echo "build rc=${PIPESTATUS[0]}"
ctest --test-dir /tmp/bs -R test_sizeclass -j1 -V 2>&1 | grep -E "waste:|large seed|decay_ms:|checks|Passed|Failed|CHECK"
/tmp/bs/fabpool_bench --workload latency --no-torch --json "${OUT:-/tmp}/h200-sizes-latency.json"
/tmp/bs/fabpool_bench --workload growth --no-torch --json "${OUT:-/tmp}/h200-sizes-growth.json"

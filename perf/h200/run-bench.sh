#!/usr/bin/env bash
# The perf harness on the H200: builds fabpool_bench against the real driver,
# with the PyTorch backend from /opt/torch/.venv, runs every workload and
# writes under $OUT:
#   build.txt         configure + build log (and the GPU, driver, torch versions)
#   bench.txt         the bench's tables
#   bench.json        every figure (perf/report.py and perf/plot.sh read it)
#   bench-stderr.txt  the bench's and its PyTorch children's stderr
# It does not stop at the first failure; every step says what it ran.
# Usage (from the repository root): OUT=/some/dir perf/h200/run-bench.sh
set -u
cd "$(dirname "$0")/../.."
. perf/h200/common.sh   # h200_out
h200_out /tmp/fabpool-bench-out
B=${B:-/tmp/b-bench}
run() { echo "+ $*"; "$@"; echo "  (exit $?)"; }
{
  run nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
  run python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11abi", torch.compiled_with_cxx11_abi())'
  run cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=Release
  run cmake --build "$B" -j16 --target fabpool_bench
  run cmake --build "$B" -j16 --target fabpool_bench_torch
  run ls -l "$B/fabpool_bench" "$B/libfabpool_bench_torch.so"
} > "$OUT/build.txt" 2>&1
tail -n 5 "$OUT/build.txt"
if [ ! -x "$B/fabpool_bench" ]; then
  echo "fabpool_bench was not built: see $OUT/build.txt"
  exit 1
fi
echo "+ $B/fabpool_bench --json $OUT/bench.json   (limit 280 s)"
start=$(date +%s)
timeout 280 "$B/fabpool_bench" --json "$OUT/bench.json" > "$OUT/bench.txt" 2> "$OUT/bench-stderr.txt"
rc=$?
echo "  exit $rc after $(( $(date +%s) - start )) s"
if [ $rc -ne 0 ]; then
  echo "--- stderr (tail)"; tail -n 20 "$OUT/bench-stderr.txt"
fi
cat "$OUT/bench.txt"
python3 -c "import json,sys; json.load(open(sys.argv[1])); print('bench.json parses')" "$OUT/bench.json" || true
exit $rc

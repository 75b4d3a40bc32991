#!/bin/bash
# session scratch: first H200 check of this session's lib changes + the new torch scripts
set -u
export PATH=/opt/torch/.venv/bin:$PATH
R=$OUT; W=/tmp/o1; mkdir -p $W
L=$R/run1.txt
{
date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv
cmake -S . -B build-h200 -DFABPOOL_TEST_DRIVER=real -DFABPOOL_WERROR=ON >/dev/null && cmake --build build-h200 -j16 2>&1 | grep -E "error|warning|Built target fabpool$"
echo "== ctest -j4 (real driver)"
ctest --test-dir build-h200 -j4 --output-on-failure --timeout 200 2>&1 | tail -60
} > $L 2>&1
echo "== torch quick" >> $L
OUT=$W TRAIN_STEPS=15 TRAIN_RUNS=1 timeout 330 bash perf/train/h200-train.sh >> $L 2>&1
cat $W/train-h200.txt >> $L 2>/dev/null
tar czf $R/run1.tgz -C $W . 2>/dev/null
tail -c 6000 $L

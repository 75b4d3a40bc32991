#!/bin/bash
# session scratch: H200 check of everything merged: real ctest -j4, sizes, training benchmark
set -u
export PATH=/opt/torch/.venv/bin:$PATH
R=$OUT; W=/tmp/o2; mkdir -p $W/sizes $W/train
L=$R/run2.txt
{
date -u; git log --oneline -1
cmake -S . -B build-h200 -DFABPOOL_TEST_DRIVER=real -DFABPOOL_WERROR=ON >/dev/null && cmake --build build-h200 -j16 2>&1 | grep -E "error|warning|Built target fabpool$"
echo "== ctest -j4 (real driver)"
timeout 200 ctest --test-dir build-h200 -j4 --output-on-failure --timeout 150 2>&1 | grep -vE "^ +Start" | tail -70
echo "== sizes"
OUT=$W/sizes timeout 170 bash perf/h200/sizes.sh 2>&1 | tail -60
} > $L 2>&1
echo "== train" >> $L
OUT=$W/train TRAIN_STEPS=50 TRAIN_RUNS=3 timeout 320 bash perf/train/h200-train.sh >/dev/null 2>&1
cat $W/train/train-h200.txt >> $L 2>/dev/null
cp $W/train/train-bench.md $R/ 2>/dev/null
tar czf $R/run2.tgz -C $W . 2>/dev/null
grep -E "tests passed|Failed|\*\*\*" $L | head -20; cat $W/train/train-bench.md 2>/dev/null | tail -8; grep SUMMARY $L

#!/bin/bash
# session scratch: the training benchmark again after the shim's one-stream change
set -u
export PATH=/opt/torch/.venv/bin:$PATH
R=$OUT; W=/tmp/o4; mkdir -p $W
OUT=$W TRAIN_STEPS=50 TRAIN_RUNS=3 timeout 400 bash perf/train/h200-train.sh >/dev/null 2>&1
cp $W/train-h200.txt $W/train-bench.md $W/train-bench.json $R/ 2>/dev/null
tar czf $R/run4.tgz -C $W . 2>/dev/null
tail -12 $W/train-bench.md; grep -E "PASS|FAIL|SUMMARY" $W/train-h200.txt | tail -30

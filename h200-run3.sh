#!/bin/bash
# session scratch: the training trace (record + replay) and the RDMA / dma-buf / NCCL probes
set -u
export PATH=/opt/torch/.venv/bin:$PATH
R=$OUT; W=/tmp/o3; mkdir -p $W/trace $W/rdma
OUT=$W/trace timeout 300 bash perf/train/h200-trace.sh > $W/trace-run.txt 2>&1
OUT=$W/rdma FABPOOL_RDMA_BUILD=build-h200 timeout 200 bash tests/probe/h200-rdma.sh > $W/rdma-run.txt 2>&1
cp $W/trace/train-h200.trace.gz $R/ 2>/dev/null
tar czf $R/run3.tgz -C $W --exclude train-h200.trace.gz --exclude train.trace . 2>/dev/null
tail -45 $W/trace/h200-trace.txt; tail -25 $W/rdma-run.txt

#!/usr/bin/env bash
# shapes-turns.sh - fabpool_bench's shapes of changing sizes for an older tree and the current one, in turns, with
# cudaMallocAsync in every run: a layout change judged on its tails (the p99 of the batches is a few batches'
# worth of chunk maps, so one run says little).  Run from the repository root on the GPU machine:
#   BASE_DIR=.deps/base OUT=/some/dir perf/h200/shapes-turns.sh
# BASE_DIR holds the older tree (e.g. `git archive <rev> | tar -x -C .deps/base`, its rev in .rev).  Both are built
# Release against the real driver; then `fabpool_bench --workload $WORKLOADS --allocators fabpool,cuMemAllocAsync`
# runs ROUNDS times a side (base cur base cur ...).  Writes $OUT/shapes-turns.txt and one JSON a run; the summary
# gives, per shape and side, the medians over rounds of the median, the p99 and the peak held over live, and the
# rounds where fabpool's p99 was at most cudaMallocAsync's in the same run.
set -u
OUT=${OUT:-/tmp/fabpool-shapes-turns}
BASE_DIR=${BASE_DIR:-.deps/base}
ROUNDS=${ROUNDS:-5}
WORKLOADS=${WORKLOADS:-mixed,loguniform}
mkdir -p "$OUT"
. perf/h200/common.sh   # step NAME TIMEOUT COMMAND..., `status` and h200_build
{
  echo "shapes-turns: base $BASE_DIR ($(cat "$BASE_DIR/.rev" 2>/dev/null)), current $(cat .rev 2>/dev/null || echo .)"
  nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>&1
  for side in base cur; do
    src=.; [ $side = base ] && src=$BASE_DIR
    h200_build "build-$side" 240 "$src" /tmp/st-$side fabpool_bench
  done
  for r in $(seq 1 "$ROUNDS"); do
    for side in base cur; do
      /tmp/st-$side/fabpool_bench --no-torch --workload "$WORKLOADS" --allocators fabpool,cuMemAllocAsync \
        --json "$OUT/$side-$r.json" > /dev/null 2>&1 || echo "round $r $side: rc $?"
    done
  done
  python3 - "$OUT" "$ROUNDS" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for side in ("base", "cur"):
    for r in range(1, rounds + 1):
        try:
            d = json.load(open("%s/%s-%d.json" % (out, side, r)))
        except (OSError, ValueError):
            continue
        runs = {}
        for x in d["results"]:
            if x.get("ok") and "p99_ns" in x:
                runs[(x["label"], x["allocator"])] = x
        for (label, alloc), x in runs.items():
            if alloc != "fabpool":
                continue
            other = runs.get((label, "cuMemAllocAsync"))
            rows.setdefault((label, side), []).append(
                (x["median_ns"], x["p99_ns"], x["peak_held_over_live"], other["p99_ns"] if other else None))
print("%-28s %-4s %6s %10s %10s %9s %14s %s" % ("shape", "side", "rounds", "median ns", "p99 ns", "peak/live",
                                               "cMA p99 ns", "p99 <= cMA"))
for (label, side), v in sorted(rows.items()):
    med = lambda i: statistics.median([t[i] for t in v if t[i] is not None] or [float("nan")])
    wins = sum(1 for t in v if t[3] is not None and t[1] <= t[3])
    print("%-28s %-4s %6d %10.1f %10.1f %9.3f %14.1f %d of %d" % (label, side, len(v), med(0), med(1), med(2), med(3),
                                                               wins, len(v)))
EOF
} 2>&1 | tee "$OUT/shapes-turns.txt"

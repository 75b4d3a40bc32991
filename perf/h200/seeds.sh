#!/usr/bin/env bash
# seeds.sh - fabpool_bench's shapes of changing sizes over other random draws, fabpool beside PyTorch's caching
# allocator (default and expandable segments) and cudaMallocAsync in every run: the memory bound judged as a
# property of the layout, each draw against the best of PyTorch's allocators on the same draw.  Run from the
# repository root on the GPU machine (PyTorch in /opt/torch/.venv or on PATH):
#   SEEDS="1 2 3" WORKLOADS=mixed,loguniform OUT=/some/dir perf/h200/seeds.sh
# Builds the tree Release against the real driver (with PyTorch's columns), runs `fabpool_bench --seed N` for each
# seed, and writes $OUT/seeds.txt and one JSON a seed.  The summary gives, per shape, each allocator's mean and most
# peak held over peak live over the seeds, and the draws where fabpool held at most the best of PyTorch's + 0.02.
# DEADLINE=S starts no seed after S seconds (the summary covers the seeds that ran).
set -u
OUT=${OUT:-/tmp/fabpool-seeds}
SEEDS=${SEEDS:-1 2 3 4 5 6}
WORKLOADS=${WORKLOADS:-mixed,loguniform}
DEADLINE=${DEADLINE:-100000}
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step, `status` and h200_build
h200_out "$OUT"   # OUT made; PyTorch's venv first on PATH
{
  h200_head "seeds: fabpool_bench --workload $WORKLOADS over seeds $SEEDS"
  h200_torch
  h200_build build 240 . /tmp/seeds-build fabpool_bench
  t0=$(date +%s)
  for s in $SEEDS; do
    if [ $(( $(date +%s) - t0 )) -gt "$DEADLINE" ]; then echo "deadline: no seed after $s"; break; fi
    /tmp/seeds-build/fabpool_bench --workload "$WORKLOADS" --seed "$s" \
      --allocators fabpool,cuMemAllocAsync,torch,torch_expandable --json "$OUT/seed-$s.json" > "$OUT/seed-$s.txt" 2>&1 \
      || echo "seed $s: rc $?"
  done
  python3 - "$OUT" <<'EOF'
import glob, json, statistics, sys
out = sys.argv[1]
ratio = {}   # (label, allocator) -> {seed: peak held / peak live}
median = {}  # (label, allocator) -> {seed: median ns an operation}
for f in sorted(glob.glob(out + "/seed-*.json")):
    seed = int(f.rsplit("-", 1)[1].split(".")[0])
    try:
        d = json.load(open(f))
    except (OSError, ValueError):
        continue
    for x in d["results"]:
        if x.get("ok") and "peak_held_over_live" in x:
            ratio.setdefault((x["label"], x["allocator"]), {})[seed] = x["peak_held_over_live"]
            median.setdefault((x["label"], x["allocator"]), {})[seed] = x["median_ns"]
labels = sorted({l for l, _ in ratio})
if not any(a in ("torch", "torch_expandable") for _, a in ratio):
    print("seeds.sh: no PyTorch columns in the runs (the bench's libfabpool_bench_torch.so was not built or did "
          "not load: see seed-*.txt)")
    sys.exit(1)
print("%-28s %-18s %6s %8s %8s" % ("shape", "allocator", "seeds", "mean", "most"))
for label in labels:
    for alloc in ("fabpool", "torch", "torch_expandable", "cuMemAllocAsync"):
        v = ratio.get((label, alloc))
        if v:
            print("%-28s %-18s %6d %8.4f %8.3f" % (label, alloc, len(v), statistics.mean(v.values()), max(v.values())))
    fab = ratio.get((label, "fabpool"), {})
    ok = [s for s in fab if any(s in ratio.get((label, t), {}) for t in ("torch", "torch_expandable"))]
    within = [s for s in ok if fab[s] <= min(ratio[(label, t)][s] for t in ("torch", "torch_expandable")
                                            if s in ratio.get((label, t), {})) + 0.02]
    print("%-28s fabpool within the best of PyTorch's + 0.02 on %d of %d draws%s" % (
        label, len(within), len(ok), "" if len(within) == len(ok) else
        " (not on seeds %s)" % ", ".join(str(s) for s in sorted(set(ok) - set(within)))))
    # speed on the same draws: each allocator's median over fabpool's, per seed
    for alloc in ("torch", "torch_expandable", "cuMemAllocAsync"):
        v = median.get((label, alloc), {})
        r = sorted(v[s] / fm for s, fm in median.get((label, "fabpool"), {}).items() if s in v and fm > 0)
        if r:
            print("%-28s %-18s median / fabpool's: least %.1fx, median %.1fx over %d draws" % (
                label, alloc, r[0], statistics.median(r), len(r)))
EOF
} 2>&1 | tee "$OUT/seeds.txt"

#!/usr/bin/env bash
# uniform-turns.sh - the uniform 1 B..64 KiB shape's median against PyTorch's caching allocator, for an older tree
# and the current one with two values of slab_max, in turns, PyTorch's allocators in every run: what the memory
# bound of best fit costs in speed, and what slab_max buys back.  Run from the repository root on the GPU machine
# (PyTorch in /opt/torch/.venv or on PATH):
#   BASE_DIR=.deps/pre OUT=/some/dir perf/h200/uniform-turns.sh
# BASE_DIR holds the older tree (e.g. `git archive <rev> | tar -x -C .deps/pre`, its rev in .rev); it runs
# `fabpool_bench --workload mixed` (every allocator: trees before --allocators have no choice).  The current tree
# runs `--allocators fabpool,torch,torch_expandable` with FABPOOL_CONF=slab_max:S for each S in SLAB_MAX
# ("4KiB 64KiB").  ROUNDS (4) rounds: base, then each S.  Writes $OUT/uniform-turns.txt and one JSON a run; the
# summary gives, per side, each round's median ns, PyTorch's median over fabpool's in the same run and the peak
# held over live, and the median of the rounds.
set -u
OUT=${OUT:-/tmp/fabpool-uniform-turns}
BASE_DIR=${BASE_DIR:-.deps/pre}
ROUNDS=${ROUNDS:-4}
SLAB_MAX=${SLAB_MAX:-4KiB 64KiB}
. perf/h200/common.sh   # h200_gpu, step, `status` and h200_build
mkdir -p "$OUT"
[ -d /opt/torch/.venv/bin ] && export PATH=/opt/torch/.venv/bin:$PATH
{
  echo "uniform-turns: base $BASE_DIR ($(cat "$BASE_DIR/.rev" 2>/dev/null)), current $(cat .rev 2>/dev/null || echo .)"
  h200_gpu
  h200_build build-base 240 "$BASE_DIR" /tmp/ut-base
  h200_build build-cur 240 . /tmp/ut-cur fabpool_bench
  sides=(base)
  for s in $SLAB_MAX; do sides+=("slab_max:$s"); done
  for r in $(seq 1 "$ROUNDS"); do
    for side in "${sides[@]}"; do
      name=${side//:/-}
      if [ "$side" = base ]; then
        timeout 300 /tmp/ut-base/fabpool_bench --workload mixed --json "$OUT/$name-$r.json" > "$OUT/$name-$r.txt" 2>&1
      else
        FABPOOL_CONF=$side timeout 300 /tmp/ut-cur/fabpool_bench --workload mixed \
          --allocators fabpool,torch,torch_expandable --json "$OUT/$name-$r.json" > "$OUT/$name-$r.txt" 2>&1
      fi
      echo "round $r $side: rc $?"
    done
  done
  python3 - "$OUT" "$ROUNDS" "${sides[@]}" <<'EOF'
import json, statistics, sys
out, rounds, sides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("%-16s %s" % ("side", "per round: fabpool's median ns, PyTorch's median over it, peak held / live"))
for side in sides:
    v = []
    for r in range(1, rounds + 1):
        try:
            d = json.load(open("%s/%s-%d.json" % (out, side.replace(":", "-"), r)))
        except (OSError, ValueError):
            continue
        runs = {x["allocator"]: x for x in d["results"] if x.get("ok") and x["label"].startswith("uniform")}
        fab, torch = runs.get("fabpool"), runs.get("torch")
        if fab and torch and fab.get("median_ns") and torch.get("median_ns"):
            v.append((fab["median_ns"], torch["median_ns"] / fab["median_ns"], fab["peak_held_over_live"]))
    if not v:
        print("%-16s no run with fabpool's and PyTorch's columns" % side)
        continue
    print("%-16s %s   median of rounds: %.1f ns, %.1fx" % (side, "  ".join("%.1f ns %.1fx %.3f" % t for t in v),
          statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)))
EOF
} 2>&1 | tee "$OUT/uniform-turns.txt"

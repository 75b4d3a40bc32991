#!/usr/bin/env bash
# compare.sh - fabpool_bench's hot path and growth for older trees and the current one in one run (a change
# that is not about speed must keep both within 10 %).  Run from the repository root on the GPU machine:
#   BASE_DIR=.deps/base OUT=/some/dir perf/h200/compare.sh
#   BASE_DIRS=".deps/a .deps/b" OUT=/some/dir perf/h200/compare.sh     (several older trees)
# Each base dir holds an older tree (e.g. `git archive <rev> | tar -x -C .deps/base`, its rev in .rev).
# All are built Release against the real driver; then the benches run in turns, ROUNDS times
# (A B C A B C ...), so that clocks and other tenants weigh on all alike.  DEADLINE=S starts no round after S
# seconds of rounds (the figures are medians over the rounds that ran).  WORKLOADS="growth" runs one of the two;
# PIN="taskset -c 5" runs each bench on one core (the machine's rounds are bimodal by core and clock).  Printed, and written to
# $OUT/compare.txt: per round and side the median of alloc+free of a cached 256 B block (1 and 16 threads) and the
# growth workload's us a step; at the end the median over rounds of each and the ratio current / base.
set -u
OUT=${OUT:-/tmp/fabpool-compare}
BASE_DIRS=${BASE_DIRS:-${BASE_DIR:-.deps/base}}
read -r -a bases <<< "$BASE_DIRS"
sides=()
for i in "${!bases[@]}"; do sides+=("base$i"); done
sides+=(cur)
src_of() { if [ "$1" = cur ]; then echo .; else echo "${bases[${1#base}]}"; fi; }
ROUNDS=${ROUNDS:-5}
mkdir -p "$OUT"
. perf/h200/common.sh   # step NAME TIMEOUT COMMAND... and `status`
{
  for i in "${!bases[@]}"; do echo "compare: base$i ${bases[$i]} ($(cat "${bases[$i]}/.rev" 2>/dev/null))"; done
  echo "compare: current $(cat .rev 2>/dev/null || echo .)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
  # the trees build side by side (the bench alone: about half a minute each)
  t0=$(date +%s)
  for side in "${sides[@]}"; do
    src=$(src_of "$side")
    (cmake -S "$src" -B /tmp/cmp-$side -DFABPOOL_TEST_DRIVER=real -DBUILD_TESTING=OFF -DCMAKE_BUILD_TYPE=Release \
       >/dev/null && cmake --build /tmp/cmp-$side -j8 --target fabpool_bench >/dev/null; echo "build-$side: rc $?") &
  done
  wait
  echo "builds: $(( $(date +%s) - t0 )) s"
  # DEADLINE (seconds from the start of the rounds): no round starts after it, so that the run ends in time
  t0=$(date +%s)
  for r in $(seq 1 "$ROUNDS"); do
    if [ -n "${DEADLINE:-}" ] && [ $(( $(date +%s) - t0 )) -ge "$DEADLINE" ]; then
      echo "round $r and later: not started (DEADLINE $DEADLINE s)"; break
    fi
    for side in "${sides[@]}"; do
      for w in ${WORKLOADS:-latency growth}; do
        timeout 120 ${PIN:-} /tmp/cmp-$side/fabpool_bench --no-torch --workload $w --json "$OUT/$side-$w-$r.json" \
          > "$OUT/$side-$w-$r.txt" 2>&1 || echo "round $r $side $w: rc $?"
      done
    done
  done
  python3 - "$OUT" "$ROUNDS" "${sides[@]}" <<'PY'
import json, statistics, sys
out, rounds, sides = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def figs(side, r):
    hot = grow = hot16 = None
    def load(w):
        try:
            return json.load(open(f"{out}/{side}-{w}-{r}.json"))["results"]
        except (OSError, ValueError, KeyError):
            return []
    for x in load("latency"):
        if x.get("allocator") == "fabpool" and x.get("size") == 256 and not x.get("cold") and x.get("ok"):
            if x.get("threads") == 1:
                hot = x["median_ns"]
            elif x.get("threads") == 16:
                hot16 = x["median_ns"]
    for x in load("growth"):
        if x.get("allocator") == "fabpool" and x.get("label") == "plain" and x.get("ok"):
            grow = x["us_per_step"]
    return hot, grow, hot16
rows = {s: [figs(s, r) for r in range(1, rounds + 1)] for s in sides}
names = ("hot path 256 B", "growth", "hot path 256 B, 16 threads")
for r in range(rounds):
    print(f"round {r+1}: " + "; ".join(f"{n} " + ", ".join(f"{s} {rows[s][r][i]}" for s in sides)
                                       for i, n in enumerate(names)))
ok = True
for i, what, unit in ((0, "hot path 256 B alloc+free", "ns"), (1, "growth", "us/step"),
                      (2, "hot path 256 B alloc+free, 16 threads", "ns")):
    c = [x[i] for x in rows["cur"] if x[i] is not None]
    for base in sides[:-1]:
        b = [x[i] for x in rows[base] if x[i] is not None]
        if not b and not c:
            continue  # a workload not run (WORKLOADS)
        if not b or not c:
            print(f"{what}: missing figures for {base} or current"); ok = False; continue
        mb, mc = statistics.median(b), statistics.median(c)
        ratio = mc / mb
        verdict = "PASS" if ratio <= 1.10 else "FAIL"
        ok = ok and ratio <= 1.10
        print(f"{what}: {base} median {mb:.2f} {unit} (spread {min(b):.2f}-{max(b):.2f}), current {mc:.2f} {unit} "
              f"(spread {min(c):.2f}-{max(c):.2f}), current/{base} {ratio:.3f}: {verdict} (within 10 %)")
print("COMPARE", "PASS" if ok else "FAIL")
PY
  echo "SUMMARY ${status[*]}"
} 2>&1 | tee "$OUT/compare.txt" | tail -n 20

#!/usr/bin/env bash
# compare.sh - fabpool_bench's hot path and growth for two trees in one run (a refactor must keep
# both within 10 %).  Run from the repository root on the GPU machine:
#   BASE_DIR=.deps/base OUT=/some/dir perf/h200/compare.sh
# BASE_DIR holds the older tree (e.g. `git archive <rev> | tar -x -C .deps/base`); the current tree is the
# other.  Both are built Release against the real driver; then the two benches run alternately, ROUNDS times
# (A B A B ...), so that clocks and other tenants weigh on both alike.  Printed, and written to
# $OUT/compare.txt: per round and side the median of alloc+free of a cached 256 B block (1 thread) and the
# growth workload's us a step; at the end the median over rounds of each and the ratio current / base.
set -u
OUT=${OUT:-/tmp/fabpool-compare}
BASE_DIR=${BASE_DIR:-.deps/base}
ROUNDS=${ROUNDS:-5}
mkdir -p "$OUT"
. perf/h200/step.sh
{
  echo "compare: base $BASE_DIR ($(cat "$BASE_DIR/.rev" 2>/dev/null)), current $(cat .rev 2>/dev/null || echo .)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
  for side in base cur; do
    src=.; [ $side = base ] && src=$BASE_DIR
    step "build-$side" 240 bash -c "cmake -S '$src' -B /tmp/cmp-$side -DFABPOOL_TEST_DRIVER=real -DBUILD_TESTING=OFF \
      -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build /tmp/cmp-$side -j16 --target fabpool_bench >/dev/null"
  done
  for r in $(seq 1 "$ROUNDS"); do
    for side in base cur; do
      for w in latency growth; do
        timeout 120 /tmp/cmp-$side/fabpool_bench --no-torch --workload $w --json "$OUT/$side-$w-$r.json" \
          > "$OUT/$side-$w-$r.txt" 2>&1 || echo "round $r $side $w: rc $?"
      done
    done
  done
  python3 - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def figs(side, r):
    hot = grow = None
    try:
        for x in json.load(open(f"{out}/{side}-latency-{r}.json"))["results"]:
            if x.get("allocator") == "fabpool" and x.get("size") == 256 and x.get("threads") == 1 and not x.get("cold") and x.get("ok"):
                hot = x["median_ns"]
        for x in json.load(open(f"{out}/{side}-growth-{r}.json"))["results"]:
            if x.get("allocator") == "fabpool" and x.get("label") == "plain" and x.get("ok"):
                grow = x["us_per_step"]
    except Exception as e:
        print(f"round {r} {side}: {e}")
    return hot, grow
rows = {s: [figs(s, r) for r in range(1, rounds + 1)] for s in ("base", "cur")}
for r in range(rounds):
    print(f"round {r+1}: hot path 256 B base {rows['base'][r][0]} ns, current {rows['cur'][r][0]} ns; "
          f"growth base {rows['base'][r][1]} us/step, current {rows['cur'][r][1]} us/step")
ok = True
for i, what, unit in ((0, "hot path 256 B alloc+free", "ns"), (1, "growth", "us/step")):
    b = [x[i] for x in rows["base"] if x[i] is not None]
    c = [x[i] for x in rows["cur"] if x[i] is not None]
    if not b or not c:
        print(f"{what}: missing figures"); ok = False; continue
    mb, mc = statistics.median(b), statistics.median(c)
    ratio = mc / mb
    verdict = "PASS" if ratio <= 1.10 else "FAIL"
    ok = ok and ratio <= 1.10
    print(f"{what}: base median {mb:.2f} {unit} (spread {min(b):.2f}-{max(b):.2f}), current {mc:.2f} {unit} "
          f"(spread {min(c):.2f}-{max(c):.2f}), current/base {ratio:.3f}: {verdict} (within 10 %)")
print("COMPARE", "PASS" if ok else "FAIL")
PY
  echo "SUMMARY ${status[*]}"
} 2>&1 | tee "$OUT/compare.txt" | tail -n 20

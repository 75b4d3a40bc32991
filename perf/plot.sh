#!/usr/bin/env bash
# Plots of a fabpool_bench JSON file (PNG, with gnuplot; Debian: gnuplot-nox):
#   latency-warm.png    median ns per alloc+free against size, one line per allocator (p99 as bars)
#   latency-cdf.png     the distribution (quantiles p0..p100) at 256 B, warm, one thread
#   latency-cold.png    median ns per alloc+free after the cache was emptied
#   growth-memory.png   device memory held over the 256 MiB -> 4 GiB growth, and the live size
#   trace-memory.png    the same over the HybridEP trace
# Usage: perf/plot.sh bench.json [outdir]
set -euo pipefail
json=${1:?usage: perf/plot.sh bench.json [outdir]}
out=${2:-$(dirname "$json")}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 - "$json" "$tmp" <<'PY'
import json, sys, os
d = json.load(open(sys.argv[1])); t = sys.argv[2]
names = {a["key"]: a["name"] for a in d["allocators"]}
res = d["results"]
def write(fn, rows):
    with open(os.path.join(t, fn), "w") as f:
        f.write("\n".join(rows) + "\n")
for label in ("warm", "cold"):
    keys = []
    for a in d["allocators"]:
        rows = [f'{r["size"]} {r["median_ns"]} {r["p99_ns"]}' for r in res
                if r["workload"] == "latency" and r["label"] == label and r["allocator"] == a["key"]
                and r["ok"] == 1 and r["threads"] == 1]
        if rows:
            write(f'lat-{label}-{a["key"]}.dat', rows); keys.append(a["key"])
    write(f"lat-{label}.keys", [f'{k}\t{names[k]}' for k in keys] or ["none\tnone"])
keys = []
for r in res:
    if r["workload"] == "latency" and r["label"] == "warm" and r["size"] == 256 and r["threads"] == 1 and r["ok"] == 1:
        write(f'cdf-{r["allocator"]}.dat', [f'{q} {i * 5}' for i, q in enumerate(r["quantiles_ns"])])
        keys.append(r["allocator"])
write("cdf.keys", [f'{k}\t{names[k]}' for k in keys] or ["none\tnone"])
for w in ("growth", "trace"):
    keys = []
    live = None
    for r in res:
        if r["workload"] == w and r["label"] == "plain" and r["ok"] == 1:
            s = r["series"]
            write(f'{w}-{r["allocator"]}.dat', [f'{i + 1} {h}' for i, h in enumerate(s["held_mib"])])
            keys.append(r["allocator"]); live = live or s["live_mib"]
    if live:
        write(f"{w}-live.dat", [f"{i + 1} {v}" for i, v in enumerate(live)])
    write(f"{w}.keys", [f'{k}\t{names[k]}' for k in keys] or ["none\tnone"])
PY
plots() { # file prefix column-spec
  local keys=$1 prefix=$2 spec=$3 s=""
  while IFS=$'\t' read -r k n; do
    [ "$k" = none ] && continue
    s+="${s:+, }'$tmp/$prefix$k.dat' $spec title '$n'"
  done < "$tmp/$keys"
  echo "$s"
}
common="set terminal pngcairo size 1100,650 noenhanced font 'sans,10'; set grid; set key outside right"
if command -v gnuplot >/dev/null; then :; else echo "plot.sh: gnuplot is missing (apt-get install gnuplot-nox)" >&2; exit 1; fi
p=$(plots lat-warm.keys lat-warm- "using 1:2:2:3 with yerrorlines"); if [ -n "$p" ]; then
gnuplot -e "$common; set output '$out/latency-warm.png'; set logscale x 4; set logscale y; set xtics 4; set format x '%.0b%B';
  set title 'alloc + free of a cached size, one thread: median (bar to p99)'; set xlabel 'size (bytes)'; set ylabel 'ns a pair';
  plot $p"; fi
p=$(plots lat-cold.keys lat-cold- "using 1:2:2:3 with yerrorlines"); if [ -n "$p" ]; then
gnuplot -e "$common; set output '$out/latency-cold.png'; set logscale x 4; set logscale y; set xtics 4; set format x '%.0b%B';
  set title 'alloc + free after the cache was emptied (cold), one thread'; set xlabel 'size (bytes)'; set ylabel 'ns a pair';
  plot $p"; fi
p=$(plots cdf.keys cdf- "using 1:2 with linespoints"); if [ -n "$p" ]; then
gnuplot -e "$common; set output '$out/latency-cdf.png'; set logscale x;
  set title 'distribution of alloc + free, 256 B, warm, one thread'; set xlabel 'ns a pair'; set ylabel 'percentile';
  plot $p"; fi
for w in growth trace; do
  p=$(plots $w.keys $w- "using 1:2 with lines lw 2")
  [ -n "$p" ] || continue
  [ -f "$tmp/$w-live.dat" ] && p+=", '$tmp/$w-live.dat' using 1:2 with lines dt 2 lw 2 lc 'black' title 'live (asked)'"
  gnuplot -e "$common; set output '$out/$w-memory.png'; set logscale y;
    set title 'device memory held over the $w (cuMemGetInfo, after each step)'; set xlabel 'step'; set ylabel 'MiB';
    plot $p"
done
ls "$out"/*.png

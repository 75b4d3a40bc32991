#!/usr/bin/env bash
# seed_spread.sh - fabpool's peak held / peak live over many seeds of fabpool_bench's shapes: the same shape over
# other random draws, so that a bound is seen to be the layout's and not one draw's (docs/performance.md).
#
#   perf/seed_spread.sh BUILD_DIR FIRST LAST [WORKLOADS]
#
# Runs `fabpool_bench --workload WORKLOADS --allocators fabpool --no-torch --seed N` for N = FIRST..LAST (two at
# a time) and prints, for each shape, the mean and the most of fabpool's peak held / peak live, the seed of the
# most, and the mean count of chunks mapped and unmapped (driver calls of about 40-100 us each on the H200).
# WORKLOADS: mixed,activations,loguniform (default), families, or any list the bench takes.  On the simulated
# driver (BUILD_DIR/sim) unless FABPOOL_CUDA_LIBRARY names another driver.
set -euo pipefail
if [ $# -lt 3 ] || [ "$1" = --help ]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  [ "${1:-}" = --help ] && exit 0 || exit 2
fi
b=$(cd "$1" && pwd); first=$2; last=$3; wl=${4:-mixed,activations,loguniform}
export FABPOOL_CUDA_LIBRARY=${FABPOOL_CUDA_LIBRARY:-$b/sim/libcuda.so.1} FABSIM_MEMORY=${FABSIM_MEMORY:-64GiB}
export LD_LIBRARY_PATH="$b/sim${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" b wl
one() {
  FABSIM_MACHINE="seed-spread-$1-$$" "$b/fabpool_bench" --workload "$wl" --allocators fabpool --no-torch --seed "$1" |
    awk -v seed="$1" '/^  .* fabpool +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ / {
      label = $0; sub(/^  /, "", label); sub(/ +fabpool .*/, "", label)
      maps = ($(NF-3) == "%") ? $(NF-1) : "-"
      for (i = 1; i <= NF; i++) if ($i == "fabpool") { ratio = $(i + 4); break }
      print seed "|" label "|" ratio "|" maps }'
}
export -f one
seq "$first" "$last" | xargs -P 2 -I{} bash -c 'one {}' |
  awk -F'|' '{ n[$2]++; s[$2] += $3; if ($4 != "-") { mn[$2]++; ms[$2] += $4 }
             if (!($2 in m) || $3 > m[$2]) { m[$2] = $3; w[$2] = $1 }; if (!($2 in o)) o[$2] = ++k }
             END { for (c in o) order[o[c]] = c
                   printf "%-28s %6s %8s %8s %-6s %10s\n", "shape", "seeds", "mean", "most", "(seed)", "maps, mean"
                   for (i = 1; i <= k; i++) { c = order[i]
                     printf "%-28s %6d %8.4f %8.3f %-6s %10s\n", c, n[c], s[c] / n[c], m[c], "(" w[c] ")",
                            mn[c] ? sprintf("%.0f", ms[c] / mn[c]) : "-" } }'

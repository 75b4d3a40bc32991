#!/usr/bin/env bash
# counters.sh - where a medium block's time goes on this machine's CPU: the hardware counters of the uniform
# 1 B..64 KiB loop (perf/insn_count.c's case, 4,096 live, random replacement, on one pinned core) through
# `perf stat` and `perf record`, for one build's libfabpool.so.  Run from the repository root:
#   BUILD=/tmp/r-after OUT=DIR [PERF=perf] [PAIRS=2000000] [CORE=3] perf/h200/counters.sh
# BUILD is a configured and built tree (its insn_count and libfabpool.so); PERF the perf binary (a copy with
# its libraries where the machine has none: LD_LIBRARY_PATH set by the caller).  Writes $OUT/counters.txt:
# perf stat's counts for two run lengths (their difference a pair's), the functions and the hottest
# instructions of alloc_medium_miss and fabpool_free by samples (the CPU's clock where it has no counters: a
# virtual machine's perf may only sample).  Exit status 0.
set -u
BUILD=${BUILD:?BUILD: a built tree}
OUT=${OUT:?OUT: where counters.txt goes}
PERF=${PERF:-perf}
PAIRS=${PAIRS:-2000000}
CORE=${CORE:-3}
mkdir -p "$OUT"
LOG=$OUT/counters.txt
events=cycles,instructions,branch-misses,L1-dcache-load-misses,LLC-load-misses
{
  echo "counters of insn_count fabpool uniform on core $CORE, $(date -u)"
  counts=1
  if ! "$PERF" stat -x, -e cycles true 2>&1 | grep -q '^[0-9]'; then
    echo "perf has no hardware counters here: $("$PERF" stat -x, -e cycles true 2>&1 | head -n 2)"
    counts=0
  fi
  [ $counts = 1 ] && for n in $((PAIRS / 4)) "$PAIRS"; do
    echo "== $n pairs"
    "$PERF" stat -x, -e "$events" taskset -c "$CORE" "$BUILD/insn_count" fabpool uniform "$n" 2>&1 | tail -n 8
    "$PERF" stat -x, -e l2_rqsts.miss,l2_rqsts.references,mem_load_retired.l2_miss,mem_load_retired.l3_miss \
      taskset -c "$CORE" "$BUILD/insn_count" fabpool uniform "$n" 2>&1 | tail -n 5
  done
  echo "== topdown ($PAIRS pairs)"
  [ $counts = 1 ] && "$PERF" stat -a --topdown taskset -c "$CORE" "$BUILD/insn_count" fabpool uniform "$PAIRS" 2>&1 | tail -n 12
  echo "== samples ($PAIRS pairs)"
  "$PERF" record -q -F 10000 -o /tmp/counters.data taskset -c "$CORE" "$BUILD/insn_count" fabpool uniform "$PAIRS" \
    >/dev/null 2>&1
  "$PERF" report -i /tmp/counters.data --stdio --no-children --sort dso,sym 2>/dev/null | grep -v '^#' | grep . |
    head -n 25
  for fn in alloc_medium_miss fabpool_free free_medium; do
    echo "== the hottest instructions of $fn"
    "$PERF" annotate -i /tmp/counters.data --stdio -s "$fn" 2>/dev/null |
      awk -F: '$1 + 0 >= 0.8 {print}' | sort -t: -k1 -rn | head -n 30
  done
} > "$LOG" 2>&1
rc=$?
cat "$LOG"
exit $rc

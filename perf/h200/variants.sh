#!/usr/bin/env bash
# variants.sh - layouts of the medium path tried side by side on one machine: a base tree and variants of it
# (each a patch applied to a copy of the base), each built (Release, libfabpool.so alone) and timed in turns on
# one pinned core by medloop (perf/h200/medloop.c: the uniform 1 B..64 KiB shape, the median over batches of 32
# and the mean), with POLLUTE bytes of host memory written between batches (the bench's cold batches: its read
# of the device's memory use between them evicts the metadata), and the steady loop of insn_count (4,096 live,
# a pair's ns from two run lengths) where the build has it.  Run from the repository root:
#   BASE_DIR=.deps/base OUT=DIR [PATCHES="a.patch b.patch"] [ROUNDS=3] [POLLUTE="0 1048576 8388608"] [CORE=5]
#     perf/h200/variants.sh
# BASE_DIR holds the tree the patches apply to (`git archive <rev> | tar -x -C DIR`, its rev in .rev; `git diff`
# or `git show` output applies with patch -p1).  Writes $OUT/variants.txt: one line a run, then each variant's
# median of the rounds per POLLUTE.  Exit status: 0; 1 where the base did not build (a variant that does not
# apply or build is said and left out).
set -u
BASE_DIR=${BASE_DIR:?BASE_DIR: the tree the patches apply to}
OUT=${OUT:?OUT: where variants.txt goes}
ROUNDS=${ROUNDS:-3}
POLLUTE=${POLLUTE:-0 1048576 8388608}
CORE=${CORE:-5}
mkdir -p "$OUT"
LOG=$OUT/variants.txt
R=$(pwd)
BASE_DIR=$(cd "$BASE_DIR" && pwd)
build() {   # name source
  cmake -S "$2" -B "/tmp/variant-$1" -DCMAKE_BUILD_TYPE=Release > "/tmp/variant-$1.log" 2>&1 &&
    cmake --build "/tmp/variant-$1" -j"$(nproc)" --target fabpool >> "/tmp/variant-$1.log" 2>&1 &&
    { cmake --build "/tmp/variant-$1" -j"$(nproc)" --target insn_count >> "/tmp/variant-$1.log" 2>&1 || true; }
}
steady() {  # build dir: ns a pair of insn_count's uniform loop (2,000,000 less 500,000 pairs), or -
  [ -x "$1/insn_count" ] || { echo -; return; }
  local s a c
  s=$(date +%s%N); taskset -c "$CORE" "$1/insn_count" fabpool uniform 500000 >/dev/null 2>&1; a=$(( $(date +%s%N) - s ))
  s=$(date +%s%N); taskset -c "$CORE" "$1/insn_count" fabpool uniform 2000000 >/dev/null 2>&1; c=$(( $(date +%s%N) - s ))
  echo $(( (c - a) / 1500000 ))
}
{
  echo "variants of $BASE_DIR ($(cat "$BASE_DIR/.rev" 2>/dev/null)), $(date -u), core $CORE, $ROUNDS rounds in turns"
  gcc -O2 -I"$BASE_DIR/include" -I"$BASE_DIR/perf" "$BASE_DIR/perf/h200/medloop.c" "$BASE_DIR/perf/shapes.c" \
    -o /tmp/variant-medloop -ldl -lm || { echo "medloop did not build"; exit 1; }
  build base "$BASE_DIR" || { echo "the base did not build: /tmp/variant-base.log"; tail -n 20 /tmp/variant-base.log; exit 1; }
  names="base"
  for p in ${PATCHES:-}; do
    v=$(basename "$p" .patch)
    rm -rf "/tmp/variant-src-$v" && cp -r "$BASE_DIR" "/tmp/variant-src-$v"
    if ! (cd "/tmp/variant-src-$v" && patch -p1 -s < "$R/$p"); then echo "$v: the patch does not apply"; continue; fi
    if ! build "$v" "/tmp/variant-src-$v"; then echo "$v: did not build (/tmp/variant-$v.log)"; continue; fi
    names="$names $v"
  done
  for r in $(seq 1 "$ROUNDS"); do
    for pol in $POLLUTE; do
      for v in $names; do
        echo "round $r pollute $pol $v: $(taskset -c "$CORE" /tmp/variant-medloop "/tmp/variant-$v/libfabpool.so" 3 "$pol")"
      done
    done
    for v in $names; do echo "round $r steady $v: $(steady "/tmp/variant-$v") ns a pair"; done
  done
  echo "medians of the rounds (medloop's median, ns an operation)"
  for pol in $POLLUTE; do
    for v in $names; do
      m=$(grep "pollute $pol $v:" "$LOG" | sed 's/.*median \([0-9.]*\).*/\1/' | sort -n |
          awk '{a[NR]=$1} END {if (NR) print a[int((NR+1)/2)]}')
      echo "  pollute $pol $v: $m"
    done
  done
} > "$LOG" 2>&1
cat "$LOG"

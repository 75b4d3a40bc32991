#!/usr/bin/env bash
# release-check.sh - what a release needs checked on one GPU (H100 or H200), in one device call, within
# BUDGET_S seconds (default 560): every stage is bounded by what is left, and a stage that cannot start in time is
# said to be skipped.  Run from the repository root.  Stages (RELEASE_STAGES picks some; default all, in order):
#   build     this tree (SRC_DIR, default .) and the older one (BEFORE_DIR, default .deps/before: an export of the
#             tree to compare with, its commit in .rev), Release, the real driver
#   suite     this tree's real-driver suite at ctest -j4 (the examples included)
#   deepep    adapters/hybridep/deepep-run.sh (DEEPEP_DIR, default .deps/DeepEP): DeepEP's own test with the
#             drop-in, the drop-in's private blocks and two-process POSIX-fd handles, and the regrow rounds with
#             the older tree's drop-in beside this one's where BASE_DIR (default .deps/base) is there
#   ipc       a tensor sent to a child process through torch.multiprocessing (test_torch_contract.py ipc_child)
#   rl        adapters/torch/h200-rl.sh: torch_memory_saver's and vLLM's tests on the modules, the benchmark
#             (SRC_DIR/.deps/torch_memory_saver and SRC_DIR/.deps/vllm-tests needed)
#   wheel     adapters/torch/h200-wheel.sh installed stats-shim stats-cxx: the wheel built with the venv's python
#   hotpath   perf/h200/hotloop.c (the 256 B thread-cache hit, ns a pair) and medloop.c (the uniform 1 B..64 KiB
#             shape, ns an operation) on each tree's libfabpool.so in turns (HOT_ROUNDS rounds, 7), on one core
#   shapes    perf/torch_shapes.py --allocators fabpool of both trees, one after the other (nothing else on the
#             GPU meanwhile: it reads the device's used memory)
# Writes $OUT/release.txt (this log) and each stage's own files under $OUT; the last line is SUMMARY name=rc ...
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, h200_build, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-release release.txt
OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
BUDGET=${BUDGET_S:-560}
SRC_DIR=$(cd "${SRC_DIR:-.}" && pwd)
BEFORE_DIR=${BEFORE_DIR:-.deps/before}
[ -d "$BEFORE_DIR" ] && BEFORE_DIR=$(cd "$BEFORE_DIR" && pwd)
STAGES=" ${RELEASE_STAGES:-build suite rl hotpath wheel shapes} "
BASE_DIR=${BASE_DIR:-.deps/base}
[ -d "$BASE_DIR" ] && BASE_DIR=$(cd "$BASE_DIR" && pwd)
DEEPEP_DIR=${DEEPEP_DIR:-.deps/DeepEP}
on() { [[ $STAGES == *" $1 "* ]]; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# bstep NAME LIMIT COMMAND...: step, its limit cut to what is left (skipped where under 15 s are left)
bstep() {
  local name=$1 limit=$2 l; shift 2
  l=$(( $(left) - 5 ))
  if [ "$l" -lt 15 ]; then echo "== $name: skipped, ${l} s left of the budget"; status+=("$name=skipped"); return; fi
  [ "$l" -lt "$limit" ] && limit=$l
  step "$name" "$limit" "$@"
}
export PATH=/opt/torch/.venv/bin:$PATH
{
  h200_head "fabpool release check" "checked: $SRC_DIR ($(cat "$SRC_DIR/.rev" 2>/dev/null)), before: $BEFORE_DIR ($(cat "$BEFORE_DIR/.rev" 2>/dev/null)), budget ${BUDGET} s"
  h200_torch
  if on build; then
    h200_build build-after 200 "$SRC_DIR" /tmp/r-after
    [ -d "$BEFORE_DIR" ] && h200_build build-before 150 "$BEFORE_DIR" /tmp/r-before "fabpool fabpool_torch"
  fi
  on suite && bstep suite 150 ctest --test-dir /tmp/r-after -j4 --output-on-failure --timeout 120
  if on deepep; then
    if [ -d "$DEEPEP_DIR" ]; then
      db=$(( $(left) - 20 )); [ "$db" -gt 360 ] && db=360
      before_env=(); [ -d "$BASE_DIR" ] && before_env=("DEEPEP_BEFORE_TREE=$BASE_DIR")
      bstep deepep $((db + 15)) env OUT="$OUT/deepep" DEEPEP_RUN_BUDGET=$db DEEPEP_REGROW_ROUNDS=${DEEPEP_REGROW_ROUNDS:-2} \
        DEEPEP_RUN_SKIP="${DEEPEP_RUN_SKIP:-agree grow graphed test-upstream}" \
        "${before_env[@]}" \
        "$SRC_DIR/adapters/hybridep/deepep-run.sh" "$(cd "$DEEPEP_DIR" && pwd)"
    else
      echo "== deepep: skipped, no DeepEP tree at $DEEPEP_DIR"; status+=("deepep=skipped")
    fi
  fi
  on ipc && bstep ipc 60 python3 "$SRC_DIR/adapters/torch/test_torch_contract.py" \
       --lib /tmp/r-after/adapters/torch/libfabpool_torch.so --out "$OUT" --cases ipc_child
  on rl && bstep rl 300 env OUT="$OUT/rl" FABPOOL_RL_BUILD=/tmp/r-after bash -c "cd '$SRC_DIR' && adapters/torch/h200-rl.sh"
  on wheel && bstep wheel 200 env OUT="$OUT/wheel" bash -c "cd '$SRC_DIR' && adapters/torch/h200-wheel.sh installed stats-shim stats-cxx"
  if on hotpath; then
    gcc -O2 -I"$SRC_DIR/include" "$SRC_DIR/perf/h200/hotloop.c" -o /tmp/hotloop -ldl &&
      gcc -O2 -I"$SRC_DIR/include" -I"$SRC_DIR/perf" "$SRC_DIR/perf/h200/medloop.c" "$SRC_DIR/perf/shapes.c" \
        -o /tmp/medloop -ldl -lm || echo "hotpath: the loops did not build"
    for r in $(seq 1 "${HOT_ROUNDS:-7}"); do
      for side in before after; do
        lib=/tmp/r-$side/libfabpool.so
        [ -f "$lib" ] || continue
        bstep "hot256-$side-$r" 30 taskset -c 2 /tmp/hotloop "$lib" 256 10000000 3
        bstep "uniform-$side-$r" 30 taskset -c 2 /tmp/medloop "$lib" 3 0
      done
    done
  fi
  if on shapes; then
    for side in before after; do
      src=$SRC_DIR; [ $side = before ] && src=$BEFORE_DIR
      [ -f /tmp/r-$side/adapters/torch/libfabpool_torch.so ] || continue
      bstep "shapes-$side" 120 python3 "$src/perf/torch_shapes.py" --lib /tmp/r-$side/adapters/torch/libfabpool_torch.so \
        --allocators fabpool --json "$OUT/shapes-$side.json"
    done
  fi
  echo "SUMMARY ${status[*]} (in $(( $(date +%s) - T0 )) s)"
} >> "$LOG" 2>&1
tail -n 40 "$LOG"

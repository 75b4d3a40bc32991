#!/usr/bin/env bash
# deepep-run.sh [DEEPEP_DIR] - fabpool's HybridEP adapter in DeepEP's own
# hybrid-ep code, on one H200 (or two: DEEPEP_RUN_GPUS=2), against DeepEP's
# own allocator.  Run from anywhere; DEEPEP_DIR (default .deps/DeepEP, the
# repository's ignored folder) is a DeepEP checkout or export of the hybrid-ep
# branch (94a9f8f used) with csrc/, deep_ep/, tests/ and setup.py.  Nothing in
# it is changed: the script works on two copies under $DEEPEP_WORK
# (/tmp/deepep-work):
#   upstream/  DeepEP as it is;
#   fabpool/   the drop-in (allocator.cuh: an include and two aliases,
#              allocator.cu not built; DeepEP's own cudaMalloc and cudaFree
#              after it served by the adapter's private blocks, off with
#              FABPOOL_HYBRIDEP_PRIVATE=0) and growth in place in update_buffer
#              (on with FABPOOL_HYBRIDEP_INPLACE=1), and the agreement
#              before a regrow (FABPOOL_HYBRIDEP_AGREE=1): deepep/patch.py.
# Stages (each logged with set -x, each runs whatever failed before it, each
# bounded by a timeout and by what is left of $DEEPEP_RUN_BUDGET seconds):
#   1. build: libfabpool + test_hybridep (cmake, real driver), and both
#      hybrid_ep_cpp extensions with cpp_extension.load (deepep/build.py), in
#      parallel; CC=/usr/bin/gcc CXX=/usr/bin/g++ TORCH_CUDA_ARCH_LIST=9.0;
#   2. regrowth in DeepEP (deepep/regrow.py): update_template_config for
#      T = 1,024..16,384 step 1,024, upstream, fabpool (DeepEP's release +
#      allocate unchanged), fabpool in place, and fabpool unchanged with
#      FABPOOL_HYBRIDEP_PRIVATE=0 (DeepEP's own blocks from the driver, as
#      upstream's), in DEEPEP_REGROW_ROUNDS (3) rounds in turns
#      (deepep/rounds.py: the medians); held vs live
#      (cuMemGetInfo), 0 at the end, regrow time and its breakdown; then
#      the agreement's cost per call (2,000 calls that do not grow, with
#      FABPOOL_HYBRIDEP_AGREE=0 and 1) and the in-place regrowth with it on;
#   3. test_hybridep_private (DeepEP's own blocks through the drop-in), then
#      the two-process POSIX-fd test on one GPU: handles as bytes only
#      (pidfd_getfd), then with the fds over a socket (test_hybridep);
#   4. DeepEP's tests/test_hybrid_ep.py test_main at world size 1, upstream
#      and fabpool (1,024 tokens; the two in parallel on the one GPU);
#   5. the same test growing inside it (MAX_NUM_OF_TOKENS_PER_RANK 512,
#      NUM_TOKENS_PER_RANK 1,024; no benchmark): upstream, fabpool in place;
#   6. tests/test_graphed_hybrid_ep.py (upstream, fabpool), if time is left.
# DEEPEP_PRIVATE_CONF: a fifth variant in the rounds, fabpool unchanged with
# FABPOOL_HYBRIDEP_PRIVATE_CONF set to it.
# DEEPEP_RUN_SKIP: stages to leave out, any of "agree" (the agreement's
# cost, stage 2's end), "posix" (3), "test-upstream" (4's upstream half),
# "grow" (5), "graphed" (6); stage 6 needs about 150 s of the budget left.
# DEEPEP_BEFORE_TREE: another fabpool tree (an export of an older commit, its
# commit in .rev): its library and its drop-in are built beside this one's
# (in parallel, with that tree's deepep/ scripts) and join the rounds as the
# variant "before" (its drop-in unchanged), so that the regrow times of two
# commits are compared in one run.
# Results: $OUT/deepep-run.log (everything), $OUT/regrow-*.json,
# $OUT/summary.txt (printed at the end).
#
# Two GPUs (when a two-GPU machine is lent): DEEPEP_RUN_GPUS=2 runs stages 2,
# 4 and 5 at world size 2 (regrow.py --world 2; test_hybrid_ep.py
# --num-processes 2, which spawns one rank per GPU).  There the peers open
# each other's handles from the bytes alone (POSIX fd: pidfd_getfd), and the
# in-place variant exchanges deltas.
set -u
DEEPEP=${1:-.deps/DeepEP}
DEEPEP=$(cd "$DEEPEP" 2>/dev/null && pwd) || { echo "deepep-run.sh: no DeepEP tree at ${1:-.deps/DeepEP}"; exit 2; }
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
HERE=$ROOT/adapters/hybridep/deepep
OUT=${OUT:-/tmp/deepep-out}
W=${DEEPEP_WORK:-/tmp/deepep-work}
B=$W/fabpool-build
GPUS=${DEEPEP_RUN_GPUS:-1}
BUDGET=${DEEPEP_RUN_BUDGET:-450}
mkdir -p "$OUT"
LOG=$OUT/deepep-run.log
SUM=$OUT/summary.txt
T0=$SECONDS
status=()
SKIP=" ${DEEPEP_RUN_SKIP:-} "
skip() { case "$SKIP" in *" $1 "*) status+=("$1=skipped"); return 0 ;; *) return 1 ;; esac; }

left() { echo $((BUDGET - (SECONDS - T0))); }
# step NAME LIMIT CMD...: runs CMD with at most LIMIT seconds (less if the budget is short)
step() {
  local name=$1 limit=$2; shift 2
  local l; l=$(left)
  if [ "$l" -lt 15 ]; then echo "=== $name: SKIPPED (budget: ${l}s left)"; status+=("$name=skipped"); return 0; fi
  [ "$limit" -gt "$l" ] && limit=$l
  echo "=== $name (limit ${limit}s): $*"
  local t=$SECONDS
  timeout -k 5 "$limit" "$@"
  local rc=$?
  echo "=== $name: rc $rc in $((SECONDS - t)) s"
  status+=("$name=$rc")
  return $rc
}
# port LABEL: a rendezvous port of its own for each run (two run at once)
port() { echo $((20000 + $(echo "$1" | cksum | cut -d' ' -f1) % 20000)); }
# here VARIANT: the deepep/ scripts a DeepEP copy runs with (the before tree's own for "before")
here() { if [ "$1" = before ]; then echo "$BT/adapters/hybridep/deepep"; else echo "$HERE"; fi; }
# pyenv VARIANT: the environment a DeepEP copy runs in
pyenv() {
  echo "PYTHONPATH=$W/$1/build:$W/$1:$W/$1/tests:$(here "$1")/standin HYBRID_EP_CACHE_DIR=$W/jit-$1"
}

{
  set -x
  echo "deepep-run: $(date -u +%FT%TZ) on $(hostname), fabpool $(git rev-parse --short HEAD 2>/dev/null), DeepEP tree $DEEPEP, $GPUS GPU(s)"
  export PATH=/opt/torch/.venv/bin:$PATH
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  export CC=/usr/bin/gcc CXX=/usr/bin/g++ TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-8}
  nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
  "$CUDA_HOME/bin/nvcc" --version | tail -n 2
  /usr/bin/g++ --version | head -n 1
  echo "yama ptrace_scope: $(cat /proc/sys/kernel/yama/ptrace_scope 2>/dev/null || echo absent); uid $(id -u)"
  ls /dev/nvidia-caps-imex-channels 2>&1 | head -n 2

  # ------------------------------------------------------------ 1. build
  rm -rf "$W"
  mkdir -p "$W"
  BT=${DEEPEP_BEFORE_TREE:+$(cd "$DEEPEP_BEFORE_TREE" && pwd)}
  for v in upstream fabpool ${BT:+before}; do
    mkdir -p "$W/$v"
    cp -r "$DEEPEP/csrc" "$DEEPEP/deep_ep" "$DEEPEP/tests" "$DEEPEP/setup.py" "$W/$v/"
    mkdir -p "$W/$v/deep_ep/backend"   # as setup.py: the JIT compiles kernels from there
    cp -r "$W/$v/csrc/hybrid_ep/backend/." "$W/$v/deep_ep/backend/"
    cp "$W/$v/csrc/hybrid_ep/utils.cuh" "$W/$v/deep_ep/backend/utils.cuh"
  done
  step patch 30 python3 "$HERE/patch.py" "$W/fabpool"
  if [ -n "$BT" ]; then
    echo "before tree: $BT ($(cat "$BT/.rev" 2>/dev/null))"
    step patch-before 30 python3 "$BT/adapters/hybridep/deepep/patch.py" "$W/before"
    ( step build-before-lib 150 bash -c "cmake -S '$BT' -B '$W/before-build' -DFABPOOL_TEST_DRIVER=real \
        -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build '$W/before-build' -j4 --target fabpool" &&
      step build-before-ext 300 python3 "$BT/adapters/hybridep/deepep/build.py" --src "$W/before" \
        --build "$W/before/build" --fabpool "$BT/include" "$W/before-build" ) > "$OUT/build-before.log" 2>&1 &
    bt_pid=$!
  fi
  diff -ru "$DEEPEP/csrc" "$W/fabpool/csrc" > "$OUT/fabpool-deepep.diff"
  ( step build-upstream-ext 300 python3 "$HERE/build.py" --src "$W/upstream" --build "$W/upstream/build" \
      > "$OUT/build-upstream.log" 2>&1; echo "build-upstream-ext rc $?" ) &
  up_pid=$!
  step build-fabpool-lib 120 bash -c "cmake -S . -B '$B' -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build '$B' -j8 --target fabpool test_hybridep test_hybridep_private"
  step build-fabpool-ext 300 python3 "$HERE/build.py" --src "$W/fabpool" --build "$W/fabpool/build" \
      --fabpool "$ROOT/include" "$B" > "$OUT/build-fabpool.log" 2>&1
  wait "$up_pid"
  if [ -n "$BT" ]; then
    wait "$bt_pid"
    tail -n 3 "$OUT/build-before.log"
    [ -f "$W/before/build/hybrid_ep_cpp.so" ] && status+=(build-before-ext=0) || status+=(build-before-ext=FAILED)
  fi
  tail -n 3 "$OUT/build-upstream.log" "$OUT/build-fabpool.log"
  grep -m 5 -E "error|Error" "$OUT/build-upstream.log" "$OUT/build-fabpool.log"
  [ -f "$W/upstream/build/hybrid_ep_cpp.so" ] && status+=(build-upstream-ext=0) || status+=(build-upstream-ext=FAILED)

  # ------------------------------------------------------------ 2. regrowth in DeepEP
  regrow() {  # regrow LABEL VARIANT [ENV...] [-- regrow.py args]
    local label=$1 v=$2; shift 2
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    pushd "$W/$v/tests" >/dev/null || return 1
    step "regrow-$label" 120 env $(pyenv "$v") MASTER_PORT="$(port "regrow-$label")" "${envs[@]}" \
        python3 "$(here "$v")/regrow.py" --label "$label" --world "$GPUS" --json "$OUT/regrow-$label.json" "$@"
    local rc=$?
    popd >/dev/null
    return $rc
  }
  # upstream, fabpool unchanged and fabpool in place in rounds in turns (one pass of 15 regrows each a round),
  # so that the machine's drift over the minutes weighs on the three alike
  ROUNDS=${DEEPEP_REGROW_ROUNDS:-3}
  for r in $(seq 1 "$ROUNDS"); do
    regrow upstream.r$r upstream -- --reps 1
    regrow fabpool.r$r fabpool FABPOOL_HYBRIDEP_TIMING="$W/timing-fabpool.txt.r$r" -- --reps 1
    [ -n "$BT" ] && regrow before.r$r before FABPOOL_HYBRIDEP_TIMING="$W/timing-before.txt.r$r" -- --reps 1
    regrow fabpool-inplace.r$r fabpool FABPOOL_HYBRIDEP_INPLACE=1 FABPOOL_HYBRIDEP_TIMING="$W/timing-inplace.txt.r$r" \
        -- --reps 1
    regrow fabpool-noprivate.r$r fabpool FABPOOL_HYBRIDEP_PRIVATE=0 \
        FABPOOL_HYBRIDEP_TIMING="$W/timing-noprivate.txt.r$r" -- --reps 1
    [ -n "${DEEPEP_PRIVATE_CONF:-}" ] && regrow fabpool-privconf.r$r fabpool \
        FABPOOL_HYBRIDEP_PRIVATE_CONF="$DEEPEP_PRIVATE_CONF" FABPOOL_HYBRIDEP_TIMING="$W/timing-privconf.txt.r$r" \
        -- --reps 1
  done
  python3 "$HERE/rounds.py" "$OUT" "$ROUNDS" upstream fabpool ${BT:+before} fabpool-inplace fabpool-noprivate \
      ${DEEPEP_PRIVATE_CONF:+fabpool-privconf}
  # the agreement's cost: 2,000 calls that do not grow, without and with FABPOOL_HYBRIDEP_AGREE (one all-reduce
  # of the needed sizes per call); then the regrowth with it on
  if ! skip agree; then
  regrow agree-off fabpool FABPOOL_HYBRIDEP_INPLACE=1 FABPOOL_HYBRIDEP_AGREE=0 -- --reps 0 --calls 2000
  regrow agree-on fabpool FABPOOL_HYBRIDEP_INPLACE=1 FABPOOL_HYBRIDEP_AGREE=1 -- --reps 0 --calls 2000
  regrow fabpool-inplace-agree fabpool FABPOOL_HYBRIDEP_INPLACE=1 FABPOOL_HYBRIDEP_AGREE=1 \
      FABPOOL_HYBRIDEP_TIMING="$W/timing-inplace-agree.txt"
  fi
  cp "$W"/timing-*.txt* "$OUT/" 2>/dev/null

  # ------------------------------------------------------------ 3. two processes, one GPU, POSIX fds
  # (and first, DeepEP's own cudaMalloc / cudaFree through the drop-in's private blocks, on the real driver)
  step private-blocks 60 env FABPOOL_TEST_REAL_DRIVER=1 "$B/adapters/hybridep/test_hybridep_private"
  if ! skip posix; then
  step posix-bytes-only 60 env FABPOOL_CONF=handle_type:posix_fd FABPOOL_TEST_REAL_DRIVER=1 \
      FABPOOL_HYBRIDEP_BYTES_ONLY=1 "$B/adapters/hybridep/test_hybridep"
  step posix-socket 60 env FABPOOL_CONF=handle_type:posix_fd FABPOOL_TEST_REAL_DRIVER=1 \
      "$B/adapters/hybridep/test_hybridep"
  fi

  # ------------------------------------------------------------ 4. DeepEP's own test, both allocators
  deeptest() {  # deeptest LABEL VARIANT MAX NUM [ENV...] -- [run_test.py args]
    local label=$1 v=$2 max=$3 num=$4; shift 4
    local envs=() args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    args=("$@")
    if [ "$GPUS" -gt 1 ]; then
      ( cd "$W/$v/tests" && step "$label" 300 env $(pyenv "$v") MASTER_PORT="$(port "$label")" \
          MAX_NUM_OF_TOKENS_PER_RANK="$max" NUM_TOKENS_PER_RANK="$num" "${envs[@]}" \
          python3 test_hybrid_ep.py --num-processes "$GPUS" ) > "$OUT/$label.log" 2>&1
    else
      ( cd "$W/$v/tests" && step "$label" 300 env $(pyenv "$v") MASTER_PORT="$(port "$label")" \
          MAX_NUM_OF_TOKENS_PER_RANK="$max" NUM_TOKENS_PER_RANK="$num" "${envs[@]}" \
          python3 "$HERE/run_test.py" "${args[@]}" ) > "$OUT/$label.log" 2>&1
    fi
    local rc=$?
    grep -E "PASS|FAIL|Error|error|GB/s|DEEPEP_TEST_PASSED|=== " "$OUT/$label.log" | head -n 40
    echo "$label: rc $rc"
    return $rc
  }
  if skip test-upstream; then
    deeptest test-fabpool fabpool 1024 1024 --
    status+=("test-fabpool=$?")
  else
    deeptest test-upstream upstream 1024 1024 -- & p1=$!
    deeptest test-fabpool fabpool 1024 1024 -- & p2=$!
    wait $p1; r1=$?; wait $p2; r2=$?
    status+=("test-upstream=$r1" "test-fabpool=$r2")
  fi

  # ------------------------------------------------------------ 5. growing inside DeepEP's test
  if ! skip grow; then
  deeptest grow-upstream upstream 512 1024 -- --no-bench & p1=$!
  deeptest grow-fabpool-inplace fabpool 512 1024 FABPOOL_HYBRIDEP_INPLACE=1 \
      FABPOOL_HYBRIDEP_TIMING="$W/timing-grow-inplace.txt" -- --no-bench & p2=$!
  wait $p1; r1=$?; wait $p2; r2=$?
  status+=("grow-upstream=$r1" "grow-fabpool-inplace=$r2")
  cat "$W/timing-grow-inplace.txt" 2>/dev/null
  fi

  # ------------------------------------------------------------ 6. the graphed test, if time is left
  if skip graphed; then :
  elif [ "$(left)" -gt 150 ] && [ "$GPUS" -eq 1 ]; then
    deeptest graphed-upstream upstream 1024 1024 -- --graphed & p1=$!
    deeptest graphed-fabpool fabpool 1024 1024 -- --graphed & p2=$!
    wait $p1; r1=$?; wait $p2; r2=$?
    status+=("graphed-upstream=$r1" "graphed-fabpool=$r2")
  else
    status+=("graphed=skipped")
  fi
  nvidia-smi --query-gpu=memory.used --format=csv
  set +x
} > "$LOG" 2>&1

{
  echo "deepep-run summary ($((SECONDS - T0)) s of a ${BUDGET} s budget; $GPUS GPU(s); log $LOG)"
  echo "stages: ${status[*]}"
  grep -h "^ROUNDS\|^REGROW\|^CALLS" "$LOG" | sed 's/^/  /'
  for l in test-upstream test-fabpool grow-upstream grow-fabpool-inplace graphed-upstream graphed-fabpool; do
    [ -f "$OUT/$l.log" ] || continue
    printf '  %-22s %s PASS lines, %s FAIL, %s\n' "$l" "$(grep -c ': PASS' "$OUT/$l.log")" \
      "$(grep -c FAIL "$OUT/$l.log")" "$(grep -h -o 'DEEPEP_TEST_PASSED.*' "$OUT/$l.log" | head -n 1)"
  done
  grep -h "^test_hybridep:\|^test_hybridep_private:" "$LOG" | sed 's/^/  /'
} > "$SUM"
cat "$SUM"

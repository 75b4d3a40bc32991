#!/usr/bin/env bash
# trust-check.sh - sharing between processes on the real driver (one H100 or H200), the tree before the peer
# checks (BASE_DIR, default .deps/base: an export of the older commit with its .rev) beside this one.  Run from the
# repository root; about 15 minutes.
#   build-*     both trees, Release, the real driver (the older one: the PyTorch module only)
#   suite       this tree's real-driver suite at ctest -j4
#   symm-*      adapters/torch/test_symm_gpu.py, 4 ranks of a gloo group on the one GPU mapping each other's
#               buffers through POSIX fds over the checked socket mesh, each tree in turns (SYMM_ROUNDS, 1): the
#               resize times side by side
#   ipc         a tensor sent to a child process through torch.multiprocessing (test_torch_contract.py ipc_child):
#               the fd server, the peer checks and the token, on the C++ allocator
#   deepep      DeepEP's own tests/test_hybrid_ep.py with the drop-in and upstream, the regrow rounds, and the
#               two-process POSIX-fd handles (pidfd and token proof) of test_hybridep (adapters/hybridep/deepep-run.sh
#               with DEEPEP_RUN_SKIP="agree grow graphed"; DEEPEP_DIR, default .deps/DeepEP)
# TRUST_STAGES picks stages (default "build suite symm ipc deepep"; one command of the device tool runs at most
# 10 minutes, so run "build suite symm ipc" and then "deepep").
# SRC_DIR: the tree checked (default: this one).
# Writes $OUT/trust.txt (this log), $OUT/symm-*.json, $OUT/deepep/; the last line is SUMMARY name=rc ...
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, h200_build, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-trust trust.txt
BASE_DIR=${BASE_DIR:-.deps/base}
SRC_DIR=${SRC_DIR:-.}   # the tree to check: a committed snapshot (git archive) where the working tree may change
ROUNDS=${SYMM_ROUNDS:-1}
STAGES=" ${TRUST_STAGES:-build suite symm ipc deepep} "
on() { [[ $STAGES == *" $1 "* ]]; }
export TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
{
  h200_head "fabpool sharing trust check" "checked: $SRC_DIR ($(cat "$SRC_DIR/.rev" 2>/dev/null)), before: $BASE_DIR ($(cat "$BASE_DIR/.rev" 2>/dev/null))"
  h200_torch
  if on build; then
    h200_build build-after 420 "$SRC_DIR" /tmp/t-after
    h200_build build-before 240 "$BASE_DIR" /tmp/t-before fabpool_torch
  fi
  on suite && step suite 300 ctest --test-dir /tmp/t-after -j4 --output-on-failure --timeout 240
  on symm && for r in $(seq 1 "$ROUNDS"); do
    for side in before after; do
      src=$SRC_DIR; [ $side = before ] && src=$BASE_DIR
      step "symm-$side-$r" 200 python3 "$src/adapters/torch/test_symm_gpu.py" \
           --lib "/tmp/t-$side/adapters/torch/libfabpool_torch.so" --ranks 4 --devices 1 --steps 100 \
           --min-mib 1 --max-mib 1024 --budget-s 25 --out "$OUT/symm-$side-$r.json"
    done
  done
  on ipc && step ipc 200 python3 "$SRC_DIR/adapters/torch/test_torch_contract.py" --lib /tmp/t-after/adapters/torch/libfabpool_torch.so \
       --out "$OUT" --cases ipc_child
  DB=${DEEPEP_RUN_BUDGET:-520}
  on deepep && step deepep $((DB + 20)) env OUT="$OUT/deepep" DEEPEP_RUN_SKIP="agree grow graphed" DEEPEP_RUN_BUDGET=$DB \
       "$SRC_DIR/adapters/hybridep/deepep-run.sh" "$(cd "${DEEPEP_DIR:-.deps/DeepEP}" && pwd)"
  echo "SUMMARY ${status[*]}"
} >> "$LOG" 2>&1
tail -n 40 "$LOG"

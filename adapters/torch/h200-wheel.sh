#!/bin/bash
# h200-wheel.sh [STEP...] - the fabpool-torch wheel on one H200, as a user installs it.  Run from the repository
# root.  adapters/torch/wheel.sh builds the wheel offline with the python3 that has torch (/opt/torch/.venv where it
# exists), so that it holds libfabpool_torch_cxx.so built against that torch, and installs it with
# pip install --no-index into a fresh venv that sees torch (--system-site-packages).  Then, from a folder outside
# the repository, so that only the installed package can be imported (no --lib, no FABPOOL_TORCH_LIBRARY):
#   installed   the package is the venv's, its libraries are beside it, install() puts in the C++ allocator
#   moe         adapters/torch/test_torch_moe.py: the MoE loop on PyTorch's allocator, with install() (the C++
#               allocator; FABPOOL_TORCH_MODE=shim in the environment: the shim) and in a MemPool, bitwise the same
#   stats-shim  adapters/torch/test_torch_stats.py with the pluggable shim (FABPOOL_TORCH_MODE=shim, stats=True)
#   stats-cxx   the same with the C++ allocator (FABPOOL_TORCH_MODE=cxx)
#   sleep       perf/h200/sleep_check.py: sleep and wake of MemPool tags, the memory given back, bytes restored
#   lightning   perf/train/lightning_check.py where Lightning is installed (else skipped, said in the log)
# STEPs pick some of these (default: all); the wheel is built every time (under a minute on 16 cores).
# Writes $OUT/wheel-h200.txt (this log) and the tests' JSON reports to $OUT; the last line is SUMMARY with each
# step's rc.
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-wheel-out
OUT=$(cd "$OUT" && pwd)
LOG="$OUT/wheel-h200.txt"
W=${FABPOOL_WHEEL_DIR:-/tmp/fabpool-wheel}
ROOT=$(pwd)
PY="$W/venv/bin/python"
steps=${*:-installed moe stats-shim stats-cxx sleep lightning}
want() { case " $steps " in *" $1 "*) return 0 ;; esac; return 1; }
{
  h200_head "fabpool wheel H200 check" "steps: $steps"
  python3 -c 'import sys, torch; print(sys.executable, "torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  # what the build and the install can use (wheel.sh says which way it took)
  python3 -c 'import importlib.util as u; print("modules:", {m: bool(u.find_spec(m)) for m in
              ("build", "setuptools", "wheel", "pip", "ensurepip", "lightning", "pytorch_lightning")})' 2>&1
  step wheel 400 adapters/torch/wheel.sh python3 "$W"
  "$PY" -m zipfile -l "$W"/dist/fabpool_torch-*.whl
  unset FABPOOL_TORCH_LIBRARY FABPOOL_TORCH_CXX_LIBRARY   # FABPOOL_TORCH_MODE=shim runs moe and sleep on the shim
  cd "$W" || exit 1
  want installed && step installed 120 env FABPOOL_TORCH_MODE=auto "$PY" -c '
import os, sys, fabpool_torch, torch
here = os.path.dirname(fabpool_torch.__file__)
print("module", fabpool_torch.__file__, fabpool_torch.__version__, fabpool_torch.build_info())
assert here.startswith(sys.prefix), "the module is not the venv'"'"'s"
assert fabpool_torch.cxx_library_path() == os.path.join(here, "libfabpool_torch_cxx.so"), "no C++ allocator beside it"
info = fabpool_torch.build_info()
assert info["cxx_allocator"] and info["cxx_built_for"] == torch.__version__, "build_info() says no C++ allocator for this torch"
print("install():", fabpool_torch.install(), fabpool_torch.installed())
assert fabpool_torch.installed() == "cxx", "install() did not put in the C++ allocator"
x = torch.empty(1 << 20, device="cuda")
print("allocated", torch.cuda.memory_allocated(), fabpool_torch.build_info())
assert torch.cuda.memory_allocated() >= 4 << 20
print("PASS installed")'
  want moe && step moe 300 "$PY" "$ROOT/adapters/torch/test_torch_moe.py" --steps 200 --workdir "$OUT"
  want stats-shim && step stats-shim 120 env FABPOOL_TORCH_MODE=shim "$PY" "$ROOT/adapters/torch/test_torch_stats.py" \
       --out "$OUT/wheel-stats-shim.json"
  want stats-cxx && step stats-cxx 120 env FABPOOL_TORCH_MODE=cxx "$PY" "$ROOT/adapters/torch/test_torch_stats.py" --out "$OUT/wheel-stats-cxx.json"
  want sleep && step sleep 240 "$PY" "$ROOT/perf/h200/sleep_check.py" --out "$OUT/wheel-sleep.json"
  if want lightning; then
    if "$PY" -c 'import lightning' 2>/dev/null || "$PY" -c 'import pytorch_lightning' 2>/dev/null; then
      step lightning 300 "$PY" "$ROOT/perf/train/lightning_check.py" --out-dir "$OUT/wheel-lightning"
    else
      echo "== lightning: neither lightning nor pytorch_lightning is installed: skipped"
    fi
  fi
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
grep -E "^(PASS|FAIL) |^== .*: rc|ALL PASS|SOME FAILED|skipped|SUMMARY" "$LOG"

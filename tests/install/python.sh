#!/bin/sh
# python.sh PYTHON ROOT SRC VERSION SIM - the Python tests that need no GPU, run by PYTHON against the fabpool_torch
# package installed under ROOT (a prefix of cmake --install on PYTHONPATH, or a virtual environment the wheel was
# installed into), on the simulated driver SIM (a libcuda.so.1).  They run from a folder outside the source and
# build trees, so that nothing but the installed package can be imported; each passes the installed library.
# SRC is the repository root, VERSION the project's version.
set -u
py=$1 root=$2 src=$3 version=$4 sim=$5
fail() { echo "FAIL: $*" >&2; exit 1; }
work=$(mktemp -d) || fail "mktemp"
trap 'rm -rf "$work"' EXIT
cd "$work" || fail "cd $work"
lib=$("$py" -c 'import fabpool_torch; print(fabpool_torch.library_path())') || fail "$py cannot import fabpool_torch"
# the RL modules installed beside the package (each imports fabpool_stage, installed with them)
mods=$("$py" -c 'import os, fabpool_cumem, fabpool_memory_saver; print(os.path.dirname(fabpool_cumem.__file__))') ||
  fail "$py cannot import fabpool_cumem and fabpool_memory_saver from the installed package"
export FABPOOL_CUDA_LIBRARY="$sim" LD_LIBRARY_PATH="$(dirname "$sim")"
unset FABPOOL_TORCH_LIBRARY FABPOOL_TORCH_CXX_LIBRARY
t=$src/adapters/torch
rc=0
for test in "tests/install/test_package.py $root $version" "$t/test_torch_python.py $lib" \
            "$t/test_torch_tags.py $lib" "$t/test_torch_layout.py $lib $version" "$t/test_torch_exit.py $lib" \
            "$t/test_symm_python.py $lib" "$t/test_rl_compat.py $mods"; do
  set -- $test
  case $1 in /*) ;; *) set -- "$src/$@" ;; esac
  name=$(basename "$1" .py)
  echo "== $name"
  # one simulated machine per test, as ctest gives each
  if FABSIM_MACHINE="python-$name-$$" "$py" "$@"; then echo "$name: passed"; else echo "$name: FAILED"; rc=1; fi
done
exit $rc

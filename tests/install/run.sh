#!/bin/sh
# run.sh STEP CMAKE BUILD PREFIX SRC CC LIBDIR - fabpool's install tests (cmake/install.cmake)
#   install:      cmake --install BUILD --prefix PREFIX, and check what is there; then --component sim (the
#                 simulated driver), which the installed fabpool_replay names when no driver loads and runs on
#   find_package: build consumer/ with find_package(fabpool), run its programs
#   pkgconfig:    build consumer/consumer.c with `pkg-config --cflags --libs fabpool`, run it
#   python:       the Python tests that need no GPU against the installed fabpool_torch package (python.sh)
# The programs run against the driver named by FABPOOL_CUDA_LIBRARY (the simulated one in ctest);
# FABPOOL_SONAME is the SONAME the library must carry (install.cmake sets it); FABPOOL_PYTHONDIR the Python
# folder under the prefix, FABPOOL_PYTHON the interpreter and FABPOOL_VERSION the project's version (the python step).
set -u
step=$1 cmake=$2 build=$3 prefix=$4 src=$5 cc=$6 libdir=$7
fail() { echo "FAIL: $*" >&2; exit 1; }
run() { echo "+ $*"; "$@" || fail "$* (exit $?)"; }
case $step in
install)
  rm -rf "$prefix"
  run "$cmake" --install "$build" --prefix "$prefix"
  for f in include/fabpool.h include/fabpool_hybridep.hpp "$libdir/libfabpool.a" "$libdir/libfabpool.so" \
           "$libdir/cmake/fabpool/fabpool-config.cmake" "$libdir/cmake/fabpool/fabpool-config-version.cmake" \
           "$libdir/cmake/fabpool/fabpoolTargets.cmake" "$libdir/pkgconfig/fabpool.pc" share/doc/fabpool/LICENSE \
           share/doc/fabpool/CHANGELOG.md; do
    [ -e "$prefix/$f" ] || fail "$prefix/$f was not installed"
    echo "installed: $f"
  done
  for h in "$src"/../../include/fabpool*.h "$src"/../../include/fabpool*.hpp \
           "$src"/../../adapters/hybridep/fabpool_hybridep.hpp "$src"/../../adapters/torch/fabpool_torch.h; do
    [ -e "$h" ] || continue
    [ -e "$prefix/include/$(basename "$h")" ] || fail "header $(basename "$h") was not installed"
  done
  # the tools, and the PyTorch adapter: the package (module and library of this build) and the modules beside it
  for f in bin/fabpool_trace bin/fabpool_replay bin/fabpool_bench "$FABPOOL_PYTHONDIR/fabpool_torch/__init__.py" \
           "$FABPOOL_PYTHONDIR/fabpool_torch/libfabpool_torch.so" "$FABPOOL_PYTHONDIR/fabpool_symm.py" \
           "$FABPOOL_PYTHONDIR/fabpool_memory_saver.py" "$FABPOOL_PYTHONDIR/fabpool_cumem.py" \
           "$FABPOOL_PYTHONDIR/fabpool_stage.py"; do
    [ -e "$prefix/$f" ] || fail "$prefix/$f was not installed"
    echo "installed: $f"
  done
  out=$("$prefix/bin/fabpool_trace" --help 2>&1) || fail "the installed fabpool_trace --help: $out"
  # the simulated driver: in no install but one that asks for it; the installed replay, when no driver loads,
  # names its path, and runs on it
  sim="$prefix/$libdir/fabpool/sim/libcuda.so.1"
  [ ! -e "$sim" ] || [ "${FABPOOL_INSTALL_SIM:-OFF}" = ON ] || fail "$sim was installed without --component sim"
  run "$cmake" --install "$build" --prefix "$prefix" --component sim
  [ -e "$sim" ] || fail "$sim was not installed by --component sim"
  echo "installed: $libdir/fabpool/sim/libcuda.so.1"
  trace="$src/../../perf/traces/synthetic-train.trace.gz"
  out=$(FABPOOL_CUDA_LIBRARY=/nonexistent/libcuda.so.1 "$prefix/bin/fabpool_replay" --allocators cudaMallocAsync \
        "$trace" 2>&1) && fail "the installed fabpool_replay ran without a driver: $out"
  case $out in *"FABPOOL_CUDA_LIBRARY=$(cd "$prefix/$libdir/fabpool/sim" && pwd -P)/libcuda.so.1"*) ;;
    *) fail "without a driver, the installed fabpool_replay does not name the installed sim: $out" ;; esac
  echo "without a driver: $(printf '%s\n' "$out" | grep "not run")"
  out=$(FABPOOL_CUDA_LIBRARY="$sim" FABSIM_MEMORY=64GiB "$prefix/bin/fabpool_replay" --allocators cudaMallocAsync \
        --check "$trace" 2>&1) || fail "the installed fabpool_replay on the installed sim: $out"
  echo "on the installed sim: $(printf '%s\n' "$out" | grep "^cudaMallocAsync")"
  # the shared library carries its SONAME, and the name it gives is installed as a link
  soname=$(objdump -p "$prefix/$libdir/libfabpool.so" 2>/dev/null | awk '/SONAME/ {print $2}')
  [ -n "$soname" ] || soname=$(readelf -d "$prefix/$libdir/libfabpool.so" | sed -n 's/.*SONAME.*\[\(.*\)\].*/\1/p')
  [ "$soname" = "$FABPOOL_SONAME" ] || fail "SONAME is '$soname', expected $FABPOOL_SONAME"
  [ -e "$prefix/$libdir/$soname" ] || fail "$soname is not installed"
  echo "SONAME $soname"
  ;;
find_package)
  b="$prefix/build-find-package"
  rm -rf "$b"
  run "$cmake" -S "$src/consumer" -B "$b" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc"
  run "$cmake" --build "$b"
  for p in consumer_shared consumer_static consumer_hybridep; do
    out=$("$b/$p") || fail "$p: $out"
    echo "$p: $out"
    case $out in OK*) ;; *) fail "$p did not print OK" ;; esac
  done
  # the shared one found the installed library
  ldd "$b/consumer_shared" | grep -q "$prefix/$libdir/$FABPOOL_SONAME" || fail "consumer_shared does not load $prefix's libfabpool"
  ;;
pkgconfig)
  command -v pkg-config >/dev/null || fail "pkg-config is not installed (apt-get install pkg-config)"
  export PKG_CONFIG_PATH="$prefix/$libdir/pkgconfig"
  flags=$(pkg-config --cflags --libs fabpool) || fail "pkg-config --cflags --libs fabpool"
  echo "pkg-config --cflags --libs fabpool: $flags"
  case $flags in *"-I$prefix/"*) ;; *) fail "the flags do not point into $prefix" ;; esac
  mkdir -p "$prefix/build-pkgconfig"
  # shellcheck disable=SC2086
  run "$cc" -o "$prefix/build-pkgconfig/consumer" "$src/consumer/consumer.c" $flags -Wl,-rpath,"$prefix/$libdir"
  out=$("$prefix/build-pkgconfig/consumer") || fail "consumer: $out"
  echo "consumer: $out"
  case $out in OK*) ;; *) fail "consumer did not print OK" ;; esac
  ;;
python)
  [ -n "${FABPOOL_PYTHON:-}" ] || fail "no python3 (FABPOOL_PYTHON)"
  PYTHONPATH="$prefix/$FABPOOL_PYTHONDIR" run sh "$src/python.sh" "$FABPOOL_PYTHON" "$prefix" "$src/../.." \
    "$FABPOOL_VERSION" "$FABPOOL_CUDA_LIBRARY"
  ;;
*) fail "unknown step $step" ;;
esac
echo "$step: OK"

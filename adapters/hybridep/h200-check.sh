#!/usr/bin/env bash
# h200-check.sh - the HybridEP adapter on the real driver (an H200 machine):
# builds with -DFABPOOL_TEST_DRIVER=real, runs the two-process adapter test
# (POSIX fd handles; fabric needs an IMEX channel, which the lent machine
# lacks), and the 4-rank MPI replay if mpirun and MPI headers exist there.
# Everything goes to $OUT/hybridep-h200.txt.  Never stops at a failure.
#   OUT=/some/dir bash adapters/hybridep/h200-check.sh
cd "$(dirname "$0")/../.." || exit 1
. perf/h200/common.sh   # h200_out (this script logs its steps its own way)
h200_out /tmp/out hybridep-h200.txt
log=$LOG
: >"$log"
say() { echo "$*" | tee -a "$log"; }
step() { say "+ $*"; timeout 150 "$@" >>"$log" 2>&1; local rc=$?; say "  -> exit $rc"; return $rc; }
say "hybridep-h200: $(date -u +%FT%TZ) on $(hostname)"
step nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
b=/tmp/b-hybridep
step cmake -S . -B "$b" -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=RelWithDebInfo
# only what this check needs: the library, the adapter tests and the install
step cmake --build "$b" -j16 --target fabpool fabpool_static test_hybridep
if command -v mpirun >/dev/null; then
  step cmake --build "$b" -j16 --target test_hybridep_mpi
fi
say "== test_hybridep (two processes, POSIX fd, real driver)"
step env FABPOOL_CONF=handle_type:posix_fd FABPOOL_TEST_REAL_DRIVER=1 "$b/adapters/hybridep/test_hybridep"
if [ -x "$b/adapters/hybridep/test_hybridep_mpi" ]; then
  say "== test_hybridep_mpi (4 ranks on one GPU, POSIX fd, 100 steps; held = the device's cuMemGetInfo)"
  step env FABPOOL_CONF=handle_type:posix_fd OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun -n 4 --oversubscribe --allow-run-as-root --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
    "$b/adapters/hybridep/test_hybridep_mpi" 100
else
  say "== test_hybridep_mpi: not built (no mpirun or no MPI C++ headers on this machine)"
fi
say "== install and the consumers (their programs run on the real driver)"
p=/tmp/fabpool-install-h200
step cmake --build "$b" -j16   # cmake --install wants every installed target built
step sh tests/install/run.sh install cmake "$b" "$p" "$PWD/tests/install" cc lib
step sh tests/install/run.sh find_package cmake "$b" "$p" "$PWD/tests/install" cc lib
step sh tests/install/run.sh pkgconfig cmake "$b" "$p" "$PWD/tests/install" cc lib
step nvidia-smi --query-gpu=memory.used --format=csv
say "hybridep-h200: done"

#!/usr/bin/env bash
# check-compile.sh [DEEPEP_DIR] - without PyTorch or a GPU: patches a copy of
# DeepEP's hybrid-ep tree as deepep-run.sh does (patch.py) and compiles, with
# nvcc against a compile-only stand-in of libtorch (mock/), the files whose
# allocator calls the patch touches: buffer/intranode.cu (with growth in
# place) and extension/allgather.cu, and update_buffer in hybrid_ep.cu (the
# rest of that file needs more of libtorch than the stand-in has: its errors
# are listed but only those inside update_buffer count).  Exit 0 if clean.
set -u
DEEPEP=$(cd "${1:-.deps/DeepEP}" && pwd) || exit 2
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../../.." && pwd)
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
PYINC=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
T=$(mktemp -d)
cp -r "$DEEPEP/csrc" "$T/"
python3 "$HERE/patch.py" "$T" || exit 1
cd "$T/csrc/hybrid_ep" || exit 1
flags=(-std=c++17 --expt-relaxed-constexpr -arch=sm_90 -DSM_ARCH='"9.0"' -I"$HERE/mock" -I. -Ibackend
       -I"$ROOT/include" -I"$ROOT/adapters/hybridep" -I"$PYINC")
rc=0
for f in buffer/intranode.cu extension/allgather.cu; do
  if "$NVCC" "${flags[@]}" -c "$f" -o "$T/x.o" > "$T/log" 2>&1; then echo "check-compile: $f: ok"
  else echo "check-compile: $f: FAILED"; grep error "$T/log" | head -n 20; rc=1; fi
done
first=$(grep -n "^bool HybridEPBuffer::update_buffer" hybrid_ep.cu | cut -d: -f1)
last=$(awk -v s="$first" 'NR > s && /^}/ { print NR; exit }' hybrid_ep.cu)
"$NVCC" "${flags[@]}" -c hybrid_ep.cu -o "$T/x.o" > "$T/log" 2>&1
bad=$(grep -o 'hybrid_ep.cu([0-9]*): error[^"]*' "$T/log" | awk -F'[()]' -v a="$first" -v b="$last" \
      '$2 >= a && $2 <= b' | head -n 20)
if [ -n "$bad" ]; then echo "check-compile: update_buffer (lines $first-$last): FAILED"; echo "$bad"; rc=1
else echo "check-compile: hybrid_ep.cu update_buffer (lines $first-$last): ok"; fi
rm -rf "$T"
exit $rc

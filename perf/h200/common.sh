# common.sh - what the H200 scripts share; sourced from the repository root: . perf/h200/common.sh
#   h200_out DIR [LOGNAME]   OUT (DIR unless set) made, LOG=$OUT/LOGNAME; PyTorch's venv (/opt/torch/.venv/bin)
#                            first on PATH where the machine has it
#   h200_head TITLE [MORE]   the log's opening: "TITLE, <date>, commit <rev>[, MORE]" (the rev from .rev in a tree
#                            without git, else git's), then the GPU line (h200_gpu)
#   h200_gpu                 the GPU's name, driver and memory (total, used)
#   h200_torch               PyTorch's version, its CUDA and the device it sees
#   h200_committed_source DIR  where git is, HEAD archived into DIR and the shell moved there (helpers may be
#                            editing the tree: what is built is what is committed); says which source it took
#   step NAME TIMEOUT COMMAND...  COMMAND under a timeout, its rc and time logged, NAME=rc appended to the array
#                            `status` (the scripts' SUMMARY line)
#   h200_build NAME TIMEOUT SRC DIR [TARGET]  a step: SRC configured in DIR (Release, the real driver) and built
#                            (TARGET alone if given); its log in DIR.log, whose tail is printed if it fails
h200_out() {
  OUT=${OUT:-$1}
  mkdir -p "$OUT"
  [ -n "${2:-}" ] && LOG="$OUT/$2"
  [ -d /opt/torch/.venv/bin ] && export PATH=/opt/torch/.venv/bin:$PATH
  return 0
}
h200_gpu() { nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1; }
h200_head() {
  echo "$1, $(date -u), commit $(cat .rev 2>/dev/null || git rev-parse --short HEAD 2>/dev/null)${2:+, $2}"
  h200_gpu
}
h200_torch() {
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))' 2>&1
}
h200_committed_source() {
  if git rev-parse HEAD >/dev/null 2>&1; then
    rm -rf "$1" && mkdir -p "$1" && git archive HEAD | tar -x -C "$1" && cd "$1" || return 1
    echo "source: commit $(git -C "$OLDPWD" rev-parse --short HEAD)"
  else
    echo "source: working tree (no git)"
  fi
}
status=()
step() {
  local name=$1 limit=$2; shift 2
  echo "== $name: $*"
  local t0=$(date +%s)
  timeout "$limit" "$@"
  local rc=$?
  echo "== $name: rc $rc in $(( $(date +%s) - t0 )) s"
  status+=("$name=$rc")
}
h200_build() {
  local name=$1 limit=$2 src=$3 dir=$4 target=${5:-}
  step "$name" "$limit" bash -c "cmake -S '$src' -B '$dir' -DFABPOOL_TEST_DRIVER=real -DCMAKE_BUILD_TYPE=Release \
    > '$dir.log' 2>&1 && cmake --build '$dir' -j16 ${target:+--target $target} >> '$dir.log' 2>&1 || \
    { tail -n 20 '$dir.log'; exit 1; }"
}

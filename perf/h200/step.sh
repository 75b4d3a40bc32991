# step.sh - sourced by the H200 scripts (run from the repository root):
# step NAME TIMEOUT COMMAND... runs COMMAND under a timeout, logs its rc and
# time, and appends NAME=rc to the array `status` (the scripts' SUMMARY line).
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

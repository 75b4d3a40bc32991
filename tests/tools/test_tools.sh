#!/bin/sh
# test_tools.sh BUILD PYTHON - every tool's command line (perf/cli.h): --help describes every option and exits
# 0, an unknown option exits 2, a missing operand exits 2; the replay exits 1 when no allocator could run; and
# the JSON of fabpool_trace, fabpool_replay, fabpool_bench_stream and the library's report (stats_print:json)
# parses (python3 -m json.tool) for files whose names hold '"' and '\', the trace recorded there by
# FABPOOL_TRACE (the demo's), its path read back from the JSON as it is; that trace's memory snapshot, CSV and SVG
# plot written (the snapshot read as PyTorch's viewer reads it, the plot's title the path).  PYTHON empty: the
# JSON and file checks are skipped, and say so.
set -u
build=$1 python=${2:-}
fails=0
fail() { printf "FAILED: %s\n" "$*"; fails=$((fails + 1)); }

# tool option... : --help (exit 0, every option named), --no-such-option (exit 2)
tool() {
  t=$1; shift
  out=$("$build/$t" --help 2>&1); rc=$?
  [ $rc = 0 ] || fail "$t --help exits $rc"
  for o in "$@" --help; do
    case $out in *"$o"*) ;; *) fail "$t --help does not describe $o" ;; esac
  done
  err=$("$build/$t" --no-such-option 2>&1); rc=$?
  [ $rc = 2 ] || fail "$t --no-such-option exits $rc, not 2"
  case $err in *no-such-option*) ;; *) fail "$t --no-such-option: the message does not name it: $err" ;; esac
  echo "$t: --help and an unknown option as they should be"
}

tool fabpool_bench --quick --json --workload --no-torch --check
tool fabpool_bench_stream --pairs --json
tool fabpool_replay --allocators --level --sample --fabpool-conf --device --json --check --max-held --pace --gpu-lag
tool fabpool_trace --json --memory-snapshot --csv --plot
tool fabpool_trace_gen --steps --layers --d-model --vocab --tokens --seed
tool fabpool_demo --steps --seed

# operands and arguments that are missing or wrong: 2
"$build/fabpool_trace" >/dev/null 2>&1; [ $? = 2 ] || fail "fabpool_trace without a trace does not exit 2"
"$build/fabpool_replay" >/dev/null 2>&1; [ $? = 2 ] || fail "fabpool_replay without a trace does not exit 2"
"$build/fabpool_trace_gen" >/dev/null 2>&1; [ $? = 2 ] || fail "fabpool_trace_gen without OUT does not exit 2"
"$build/fabpool_demo" --steps 0 >/dev/null 2>&1; [ $? = 2 ] || fail "fabpool_demo --steps 0 does not exit 2"
"$build/fabpool_replay" --sample x t >/dev/null 2>&1; [ $? = 2 ] || fail "fabpool_replay --sample x does not exit 2"
"$build/fabpool_bench" --workload none >/dev/null 2>&1; [ $? = 2 ] || fail "fabpool_bench --workload none does not exit 2"

# a trace named with '"' and '\', recorded by the demo, read by the trace tool and replayed
dir=$(mktemp -d "${TMPDIR:-/tmp}/fabpool-test-tools.XXXXXX")
hostile="$dir/a\"b\\c"
FABPOOL_TRACE="$hostile.trace" "$build/fabpool_demo" --steps 40 >/dev/null || fail "the demo, traced, fails"
[ -s "$hostile.trace" ] || fail "no trace recorded"
"$build/fabpool_trace" --json "$hostile.trace" > "$hostile-trace.json"; rc=$?
[ $rc = 0 ] || fail "fabpool_trace --json exits $rc"
"$build/fabpool_replay" "$hostile.trace" --allocators fabpool --check --json "$hostile-replay.json" >/dev/null; rc=$?
[ $rc = 0 ] || fail "fabpool_replay --check exits $rc"
# the memory over time of that trace: PyTorch's snapshot, the CSV, the plot (whose title is the path, escaped)
"$build/fabpool_trace" --memory-snapshot "$hostile.pickle" --csv "$hostile.csv" --plot "$hostile.svg" \
  "$hostile.trace" >/dev/null; rc=$?
[ $rc = 0 ] && [ -s "$hostile.pickle" ] && [ -s "$hostile.csv" ] && [ -s "$hostile.svg" ] ||
  fail "fabpool_trace --memory-snapshot --csv --plot exits $rc or leaves a file empty"
"$build/fabpool_trace" --memory-snapshot "$dir/no/such/dir.pickle" "$hostile.trace" >/dev/null 2>&1; rc=$?
[ $rc = 1 ] || fail "fabpool_trace --memory-snapshot into a folder that does not exist exits $rc, not 1"
"$build/fabpool_bench_stream" --pairs 200 --json "$hostile-stream.json" >/dev/null; rc=$?
[ $rc = 0 ] || fail "fabpool_bench_stream exits $rc"
# the library's own report (stats_print:json, at destroy), whose options name the trace path
FABPOOL_CONF=stats_print:json FABPOOL_TRACE="$hostile-2.trace" "$build/fabpool_demo" --steps 5 >/dev/null \
  2>"$hostile-report.json"; rc=$?
[ $rc = 0 ] || fail "the demo with stats_print:json exits $rc"
# no allocator can run: 1
FABPOOL_CUDA_LIBRARY=/nonexistent/libcuda.so.1 "$build/fabpool_replay" "$hostile.trace" --allocators fabpool \
  >/dev/null 2>&1; rc=$?
[ $rc = 1 ] || fail "fabpool_replay with no allocator that could run exits $rc, not 1"

if [ -n "$python" ]; then
  before=$fails
  for j in trace replay stream report; do
    "$python" -m json.tool "$hostile-$j.json" >/dev/null || fail "the $j JSON does not parse: $(cat "$hostile-$j.json")"
  done
  for j in trace replay; do
    "$python" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(d["trace"] != sys.argv[2])' \
      "$hostile-$j.json" "$hostile.trace" || fail "the $j JSON does not give the trace's path back"
  done
  "$python" -c 'import json, sys; d = json.load(open(sys.argv[1])); sys.exit(d["options"]["trace"] != sys.argv[2])' \
    "$hostile-report.json" "$hostile-2.trace" || fail "the report's options do not give the trace's path back"
  "$python" "$(dirname "$0")/check_memory_snapshot.py" "$hostile.pickle" >/dev/null ||
    fail "the snapshot does not read as PyTorch's viewer reads it"
  "$python" -c 'import sys, xml.etree.ElementTree as E; t = E.parse(sys.argv[1]).getroot()
sys.exit(not any(e.text == sys.argv[2] for e in t.iter("{http://www.w3.org/2000/svg}text")))' \
    "$hostile.svg" "$hostile.trace" || fail "the plot is not SVG with the trace's path as its title"
  [ $fails != "$before" ] ||
    printf "the JSON of fabpool_trace, fabpool_replay, fabpool_bench_stream and the report parses for %s\n" "$hostile"
else
  echo "no python3: the JSON is not parsed"
fi
rm -rf "$dir"
[ $fails = 0 ] || { echo "test_tools: $fails FAILED"; exit 1; }
echo "test_tools: every tool's command line as it should be"

#!/bin/bash
# snapshot-check.sh - the training benchmark's memory over time in PyTorch's own viewer, on one H200: a fabpool run
# of perf/train/train_bench.py traced with FABPOOL_TRACE, fabpool_trace --memory-snapshot / --csv / --plot of it,
# and torch.cuda._memory_viz reading the snapshot (its text summaries, which assert that every segment's blocks
# add up, and its HTML pages).  Run from the repository root; needs CUDA 13, cmake, PyTorch 2.11 in python3.
# About 2 minutes: configure + build (~1.5 min), one run of 20 steps, the conversions.
#
# Writes under $OUT:
#   snapshot-check.txt          this log; its last line says what passed (rc 0 each)
#   snap.pickle                 the snapshot fabpool_trace wrote (open it at https://pytorch.org/memory_viz too)
#   memory.csv, memory.svg      fabpool_trace --csv / --plot of the same trace
#   trace_plot.html             python -m torch.cuda._memory_viz trace_plot (Active Memory Timeline)
#   segment_plot.html           python -m torch.cuda._memory_viz segment_plot (Allocator State History)
#   viz-stats.txt, viz-trace.txt  _memory_viz stats (segsum) and the first lines of _memory_viz trace
#   trace-summary.txt           fabpool_trace's summary
#   shim.pickle, shim_trace_plot.html  fabpool_torch.record_memory_history / dump_snapshot with the pluggable shim
# (The pages load PyTorch's MemoryViz.js from its CDN when opened; the flame graphs, `memory` and `segments`,
# fetch flamegraph.pl from the network and are not made here.)
set -u
. perf/h200/common.sh   # h200_out, h200_head, h200_torch, step NAME TIMEOUT COMMAND... and `status`
h200_out /tmp/fabpool-snapshot-out snapshot-check.txt
B=build-h200
LIB="$B/adapters/torch/libfabpool_torch.so"
STEPS=${SNAPSHOT_STEPS:-20}
{
  h200_head "fabpool memory snapshot in torch.cuda._memory_viz"
  h200_torch
  step configure 90 cmake -S . -B "$B" -DFABPOOL_TEST_DRIVER=real
  step build 180 cmake --build "$B" -j16 --target fabpool_torch fabpool_trace
  rm -f "$OUT/train.trace"
  step train 150 env FABPOOL_TRACE="$OUT/train.trace" python3 perf/train/train_bench.py --lib "$LIB" \
       --allocators fabpool --runs 1 --steps "$STEPS" --out-dir "$OUT"
  step convert 120 "$B/fabpool_trace" --memory-snapshot "$OUT/snap.pickle" --csv "$OUT/memory.csv" \
       --plot "$OUT/memory.svg" "$OUT/train.trace"
  "$B/fabpool_trace" "$OUT/train.trace" > "$OUT/trace-summary.txt" 2>&1
  ls -la "$OUT"/train.trace "$OUT"/snap.pickle "$OUT"/memory.* 2>&1
  tail -n 3 "$OUT/memory.csv"
  # the events replayed as the viewer replays them (no torch needed; the same check CI runs on the sim)
  step consistent 120 python3 tests/tools/check_memory_snapshot.py "$OUT/snap.pickle"
  # PyTorch's own reader: its command line, as a user runs it
  step viz_stats 120 sh -c "python3 -m torch.cuda._memory_viz stats '$OUT/snap.pickle' > '$OUT/viz-stats.txt'"
  tail -n 12 "$OUT/viz-stats.txt"
  step viz_trace 120 sh -c "python3 -m torch.cuda._memory_viz trace '$OUT/snap.pickle' > '$OUT/viz-trace-full.txt'"
  head -n 200 "$OUT/viz-trace-full.txt" > "$OUT/viz-trace.txt"; rm -f "$OUT/viz-trace-full.txt"
  step trace_plot 120 python3 -m torch.cuda._memory_viz trace_plot "$OUT/snap.pickle" -o "$OUT/trace_plot.html"
  step segment_plot 120 python3 -m torch.cuda._memory_viz segment_plot "$OUT/snap.pickle" -o "$OUT/segment_plot.html"
  # the pages hold the snapshot they were given, whole
  step pages 60 python3 - "$OUT" <<'EOF'
import base64, json, os, pickle, re, sys
out = sys.argv[1]
snap = pickle.load(open(os.path.join(out, "snap.pickle"), "rb"))
for page in ("trace_plot.html", "segment_plot.html"):
    html = open(os.path.join(out, page)).read()
    files = json.loads(re.search(r"const local_files = (\[.*?\])\n", html).group(1))
    data = pickle.loads(base64.b64decode(files[0]["base64"]))
    assert data == snap, page + ": not the snapshot"
    events = data["device_traces"][-1]
    print(page, len(html), "bytes,", len(events), "events,", len(data["segments"]), "segments")
EOF
  # the pluggable shim in a running program: fabpool_torch.record_memory_history / dump_snapshot, then the viewer
  step shim 120 python3 - "$LIB" "$OUT" <<'PYEOF'
import os, pickle, sys
lib, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.dirname(lib))
import fabpool_torch
fabpool_torch.install(lib, mode="shim")
fabpool_torch.record_memory_history(os.path.join(out, "shim.trace"))
import torch
from torch.cuda import _memory_viz
x = [torch.randn(n, device="cuda") for n in (1000, 1 << 18, 1 << 22)]
(x[2] * 2).sum().item()
kept = x[1].data_ptr()
del x[2], x[0]
torch.cuda.synchronize()
path = fabpool_torch.dump_snapshot(os.path.join(out, "shim.pickle"))
snap = pickle.load(open(path, "rb"))
live = {b["address"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}
events = snap["device_traces"][-1]
print("shim snapshot:", len(events), "events,", len(snap["segments"]), "segments; the kept tensor live:", kept in live)
open(os.path.join(out, "shim_trace_plot.html"), "w").write(_memory_viz.trace_plot(snap))
print(_memory_viz.segsum(snap).splitlines()[-9:-6])
sys.exit(0 if kept in live and events else 1)
PYEOF
  rm -f "$OUT/train.trace" "$OUT/shim.trace"
  echo "SUMMARY ${status[*]}"
} > "$LOG" 2>&1
tail -n 40 "$LOG"

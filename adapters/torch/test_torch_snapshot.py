"""The shim's memory snapshot through the fabpool_torch module, without torch: record_memory_history() before the
first allocation makes the shim's pool trace into a file, dump_snapshot() writes the run so far as PyTorch's memory
snapshot while the program goes on (the blocks live then, and the ones freed, as a second dump shows), and the
snapshot reads as PyTorch's viewer reads it (tests/tools/check_memory_snapshot.py).  Usage:
test_torch_snapshot.py <path of libfabpool_torch.so> <check_memory_snapshot.py>"""
import ctypes
import os
import pickle
import subprocess
import sys
import tempfile

lib_path, checker = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.dirname(lib_path))
os.environ.pop("FABPOOL_TRACE", None)
import fabpool_torch  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what)


def live_blocks(snap):
    return {b["address"]: b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"}


def events(snap):
    return snap["device_traces"][0] if snap["device_traces"] else []


tmp = tempfile.mkdtemp(prefix="fabpool-test-torch-snapshot-")
trace = os.path.join(tmp, "run%.trace")   # a '%' in the name: the pool must write it as given
lib = fabpool_torch.load(lib_path)
try:
    fabpool_torch.dump_snapshot(os.path.join(tmp, "none.pickle"))
    check(False, "dump_snapshot before anything was recorded did not refuse")
except fabpool_torch.FabpoolError as e:
    check("record_memory_history" in str(e), "the refusal says what to call: %s" % e)
check(fabpool_torch.record_memory_history(trace) == trace, "record_memory_history returns the trace's path")

sizes = [256, 1000, 4096, 1 << 20, 3 << 20, 40 << 20]
ptrs = [lib.fabpool_torch_alloc(n, 0, None) for n in sizes]
check(all(ptrs), "the shim allocated")
for p, n in list(zip(ptrs, sizes))[::2]:
    lib.fabpool_torch_free(p, n, 0, None)
kept = {p: n for p, n in list(zip(ptrs, sizes))[1::2]}
check(os.path.exists(trace), "the pool records into the path given")

first = os.path.join(tmp, "first.pickle")
check(fabpool_torch.dump_snapshot(first) == first, "dump_snapshot returns its path")
snap = pickle.load(open(first, "rb"))
check(live_blocks(snap) == kept, "the snapshot's live blocks are the ones the program holds: %s, not %s" %
      (sorted(live_blocks(snap).items()), sorted(kept.items())))
allocs = [e["addr"] for e in events(snap) if e["action"] == "alloc"]
check(sorted(allocs) == sorted(ptrs), "every allocation is in the trace, once")

# the program goes on: the next dump has what happened since
more = lib.fabpool_torch_alloc(5 << 20, 0, None)
for p, n in kept.items():
    lib.fabpool_torch_free(p, n, 0, None)
second = os.path.join(tmp, "second.pickle")
fabpool_torch.dump_snapshot(second)
snap2 = pickle.load(open(second, "rb"))
check(live_blocks(snap2) == {more: 5 << 20}, "the second snapshot: only the block allocated since is live")
check(len(events(snap2)) > len(events(snap)), "the second snapshot has the events since")
for f in (first, second):
    r = subprocess.run([sys.executable, checker, f], capture_output=True, text=True)
    check(r.returncode == 0, "%s does not read as the viewer reads it:\n%s" % (f, r.stdout[-2000:]))
lib.fabpool_torch_free(more, 5 << 20, 0, None)

# too late for a second trace: the pool exists
os.environ.pop("FABPOOL_TRACE")
try:
    fabpool_torch.record_memory_history(os.path.join(tmp, "late.trace"))
    check(False, "record_memory_history after the pool was made did not refuse")
except fabpool_torch.FabpoolError as e:
    check("before the first CUDA tensor" in str(e), "the refusal says when to call it: %s" % e)
try:
    fabpool_torch.dump_snapshot(os.path.join(tmp, "no", "such", "dir.pickle"))
    check(False, "a snapshot into a folder that does not exist did not fail")
except fabpool_torch.FabpoolError as e:
    check("cannot create" in str(e), "the failure names the file: %s" % e)

if failures:
    print("test_torch_snapshot: %d FAILED (files in %s)" % (len(failures), tmp))
    sys.exit(1)
subprocess.run(["rm", "-rf", tmp])
print("test_torch_snapshot: the shim's snapshot as the program left its memory, twice")

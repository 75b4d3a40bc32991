"""test_snapshot_trace: a PyTorch memory snapshot, written as torch.cuda.memory._dump_snapshot writes it, becomes a
fabpool trace (perf/snapshot_trace.py) that fabpool_trace reads and fabpool_replay replays against fabpool.

    python3 test_snapshot_trace.py SNAPSHOT_TRACE_PY FABPOOL_TRACE FABPOOL_REPLAY

The snapshot's history has what a real one has: a cudaMalloc'd segment and an expandable segment's maps and
unmaps, allocations on two streams, frees requested and completed, one requested and never completed (still live
at the end), one of a block from before the history began, an oom event, a time stamp that goes back, and
PyTorch's per-event fields the converter ignores (frames, compile context). Every record of the trace is checked,
then what fabpool_trace and fabpool_replay make of it, and a file that is no snapshot is refused.

A snapshot is read without running anything it carries: a pickle whose reading would call os.system (a
__reduce__) is refused by name and the command never runs (its marker file never appears); values that are not
addresses, ranges past the end of the address space, and a device beyond 1023 are refused with a message.

What a snapshot costs is bounded whatever it holds: a pickle of 43 bytes that would call list(bytes(2^31 - 1))
(gigabytes before any value is checked) is refused for naming builtins.list; one map of 8 TiB, as more than a
device holds; maps and unmaps past --max-records, a file past --max-bytes, each with a message that names the
bound; a value whose repr would be 2^40 characters or a 16,000-bit integer is named in a few words.
"""
import json
import os
import pickle
import struct
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20
failed = 0


def check(cond, what):
    global failed
    if not cond:
        failed += 1
        print(f"CHECK failed: {what}")


def ev(action, addr, size, stream=0, t=None):
    e = {"action": action, "addr": addr, "size": size, "stream": stream,
         "frames": [{"filename": "train.py", "line": 7, "name": "forward"}], "compile_context": None}
    if t is not None:
        e["time_us"] = t
    return e


class RunsCode:
    """What a hostile snapshot carries: unpickling it calls os.system(command)."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def refused_snapshots(script, d):
    """Snapshots the converter must refuse, each with its reason, running nothing."""
    sp, tp, marker = os.path.join(d, "hostile.pickle"), os.path.join(d, "hostile.trace"), os.path.join(d, "ran")
    hist = [ev("segment_alloc", 0x7F0000000000, 2 * MIB, 0, 1), ev("alloc", 0x7F0000000000, 4096, 0, 2)]
    cases = [
        ({"device_traces": [hist], "segments": [RunsCode(f"touch '{marker}'")]}, "posix.system"),
        ({"device_traces": [hist + [{"action": "alloc", "addr": RunsCode(f"touch '{marker}'"), "size": 1}]]},
         "posix.system"),
        ({"device_traces": [hist + [ev("alloc", "0x7f00", 512, 0, 3)]]}, "addr is '0x7f00'"),
        ({"device_traces": [hist + [ev("alloc", -512, 512, 0, 3)]]}, "addr is -512"),
        ({"device_traces": [hist + [ev("segment_map", (1 << 64) - 2 * MIB, 4 * MIB, 0, 3)]]},
         "runs past the end of the address space"),
        ({"device_traces": [hist + [ev("alloc", 0x7F0000001000, 1 << 64, 0, 3)]]}, "not a number of 0 to 2^64-1"),
        ({"device_traces": [hist + ["not an event"]]}, "event 2 is a str"),
        ({"device_traces": [[] for _ in range(1024)] + [hist]}, "a trace's device is 0 to 1023"),
    ]
    for snap, says in cases:
        with open(sp, "wb") as f:
            pickle.dump(snap, f, protocol=2)
        out = subprocess.run([sys.executable, script, sp, tp], capture_output=True, text=True)
        check(out.returncode != 0 and says in out.stderr, f"refused, saying '{says}': {out.stderr.strip()}")
        check(not os.path.exists(marker), "nothing the snapshot carries ran")
    # what PyTorch's snapshots hold besides dicts and lists: tuples, floats, None, booleans, nested dicts
    snap = {"device_traces": [hist], "segments": [{"segment_pool_id": (0, 0), "is_expandable": False,
                                                  "frames": [{"line": 1.0, "name": None}]}]}
    with open(sp, "wb") as f:
        pickle.dump(snap, f)
    out = subprocess.run([sys.executable, script, sp, tp], capture_output=True, text=True)
    check(out.returncode == 0, f"a snapshot of plain data read: {out.stderr.strip()}")


def run(script, sp, tp, *opts):
    """The converter on sp: (exit status, stderr, seconds), or a failed check if it takes a minute."""
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, script, *opts, sp, tp], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        check(False, f"the converter ran a minute on {os.path.basename(sp)}")
        return -1, "", 60.0
    return out.returncode, out.stderr, time.monotonic() - t0


def bounded_snapshots(script, d):
    """Small snapshots that would cost gigabytes or hours: each refused within seconds, the bound named."""
    sp, tp = os.path.join(d, "bounded.pickle"), os.path.join(d, "bounded.trace")
    page = 2 * MIB
    # PROTO 2; GLOBAL builtins.list; GLOBAL builtins.bytes; BININT 2^31-1; TUPLE1 REDUCE (bytes); TUPLE1 REDUCE
    bomb = b"\x80\x02cbuiltins\nlist\ncbuiltins\nbytes\nJ" + (2**31 - 1).to_bytes(4, "little") + b"\x85R\x85R."
    nested = []
    for _ in range(40):  # a list whose repr is 2^40 items long, 2 memo references a level in the pickle
        nested = [nested, nested]
    xs = 1 << 46
    cases = [
        (bomb, (), "names builtins.list"),
        ({"device_traces": [[ev("segment_map", xs, 4194304 * page, 0, 0)]]}, (), "more than any device holds"),
        ({"device_traces": [[ev("segment_alloc", xs + k * (1 << 39), 1 << 39, 0, k) for k in range(3)]]}, (),
         "event 2 (segment_alloc): 1649267441664 bytes mapped at once, more than any device holds"),
        ({"device_traces": [[ev("segment_map" if k % 2 == 0 else "segment_unmap", xs, 1000 * page, 0, k)
                             for k in range(100)]]}, ("--max-records", "20000"), "past --max-records (20000 records"),
        ({"device_traces": [[ev("alloc", xs + 512 * k, 512, 0, k) for k in range(30001)]]},
         ("--max-records", "30000"), "event 30000 (alloc) takes the trace past --max-records"),
        ({"device_traces": [[ev("alloc", xs, 512, 0, 1)]], "pad": "x" * 4096}, ("--max-bytes", "4000"),
         "larger than --max-bytes (4000 bytes)"),
        ({"device_traces": [[ev("alloc", nested, 512, 0, 1)]]}, (), "addr is a list, not a number"),
        ({"device_traces": [[ev("alloc", 10**5000, 512, 0, 1)]]}, (), "addr is an integer of 16610 bits"),
    ]
    for snap, opts, says in cases:
        with open(sp, "wb") as f:
            f.write(snap if isinstance(snap, bytes) else pickle.dumps(snap, protocol=2))
        rc, err, secs = run(script, sp, tp, *opts)
        check(rc == 1 and says in err and secs < 30, f"refused in {secs:.1f} s, saying '{says}': {err.strip()[:300]}")
        print(f"refused in {secs:.2f} s: {err.strip()[:160]}")
    # the bound raised: the same maps and unmaps converted
    with open(sp, "wb") as f:
        pickle.dump({"device_traces": [[ev("segment_map" if k % 2 == 0 else "segment_unmap", xs, 1000 * page, 0, k)
                                        for k in range(100)]]}, f)
    rc, err, secs = run(script, sp, tp, "--max-records", "100000")
    check(rc == 0 and os.path.getsize(tp) == 64 + 40 * 100000, f"converted under a bound raised: {err.strip()}")


def main():
    script, fabpool_trace, fabpool_replay = sys.argv[1:4]
    seg, seg2, xs = 0x7F0000000000, 0x7F0800000000, 0x7F1000000000  # two cudaMalloc'd segments; an expandable one
    s1, s2 = 0x5A5A00, 0x6B6B00
    trace = [
        ev("free_completed", seg + 64 * MIB, 512, s1, 1000),       # a block from before the history
        ev("segment_alloc", seg, 20 * MIB, s1, 1001),
        ev("segment_alloc", seg2, 2 * MIB, s2, 1001),
        ev("alloc", seg, 4 * MIB, s1, 1002),
        ev("alloc", seg + 4 * MIB, 6 * MIB + 512, s2, 1003),
        ev("segment_map", xs, 6 * MIB, s1, 1004),
        ev("alloc", xs, 5 * MIB, s1, 1005),                       # live: 4 + 6 + 5 MiB + 512
        ev("free_requested", seg, 4 * MIB, s1, 1006),
        ev("free_completed", seg, 4 * MIB, s1, 1007),
        ev("free_requested", seg + 4 * MIB, 6 * MIB + 512, s2, 1003),  # time goes back: taken as 1007
        ev("oom", 0, 64 * MIB, s1, 1008),
        ev("segment_unmap", xs + 4 * MIB, 2 * MIB, s1, 1009),      # unmaps a page of the 6 MiB map
        ev("alloc", seg, 1 * MIB, s1, 1010),
        ev("free_completed", seg, 1 * MIB, s1, 1011),
        ev("free_completed", xs, 5 * MIB, s1, 1012),
        ev("segment_unmap", xs, 4 * MIB, s1, 1013),
        ev("segment_free", seg2, 2 * MIB, s2, 1014),
    ]
    snap = {"segments": [], "device_traces": [[], trace], "allocator_settings": {"expandable_segments": True}}
    with tempfile.TemporaryDirectory() as d:
        sp, tp = os.path.join(d, "snap.pickle"), os.path.join(d, "run.trace.gz")
        with open(sp, "wb") as f:
            pickle.dump(snap, f)
        out = subprocess.run([sys.executable, script, sp, tp], capture_output=True, text=True)
        print(out.stdout + out.stderr)
        check(out.returncode == 0, "the converter ran")
        check("device 1" in out.stdout, "the first device with a history taken")
        check("peak live 15.0 MiB; PyTorch held 28.0 MiB" in out.stdout, "peaks printed")
        check("left out: 1 frees of blocks from before the history" in out.stdout, "the early free counted")
        check("left out: 1 oom events" in out.stdout, "the oom event counted")

        import gzip
        with gzip.open(tp, "rb") as f:
            raw = f.read()
        check(raw[:8] == b"FPTRACE\0", "the magic")
        version, hb, rb, device, gran, slab_max, n, _ = struct.unpack_from("<IIIiQQQQ", raw, 8)
        check((version, hb, rb, device, gran) == (1, 64, 40, 1, 2 * MIB), "the header")
        recs = [struct.unpack_from("<QQQQBBHI", raw, 64 + 40 * i) for i in range(n)]
        check(len(raw) == 64 + 40 * n, "the record count")
        got = [(op, ptr, size, arg) for _, ptr, size, arg, op, _, _, _ in recs]
        want = [(10, seg, 20 * MIB, 0), (10, seg2, 2 * MIB, 0), (7, seg, 4 * MIB, s1),
                (7, seg + 4 * MIB, 6 * MIB + 512, s2)]
        want += [(10, xs + k * MIB, 2 * MIB, 0) for k in (0, 2, 4)]
        want += [(7, xs, 5 * MIB, s1), (8, seg, 0, s1), (11, xs + 4 * MIB, 2 * MIB, 0), (7, seg, MIB, s1),
                 (8, seg, 0, s1), (8, xs, 0, s1), (11, xs, 2 * MIB, 0), (11, xs + 2 * MIB, 2 * MIB, 0),
                 (11, seg2, 2 * MIB, 0)]
        check(got == want, f"the records: {got}")
        times = [r[0] for r in recs]
        check(times == sorted(times) and times[0] == 1000, f"time never goes back: {times}")

        out = subprocess.run([fabpool_trace, "--json", tp], capture_output=True, text=True)
        check(out.returncode == 0, f"fabpool_trace read it: {out.stderr}")
        s = json.loads(out.stdout) if out.returncode == 0 else {}
        check(s.get("live_peak") == 15 * MIB + 512, f"fabpool_trace's live peak: {s.get('live_peak')}")
        check(s.get("live_end") == 6 * MIB + 512, f"what stays live: {s.get('live_end')}")

        out = subprocess.run([fabpool_replay, "--allocators", "fabpool", "--sample", "1", "--check", tp],
                             capture_output=True, text=True)
        print(out.stdout + out.stderr)
        check(out.returncode == 0, "fabpool_replay --check replayed it against fabpool")

        check(subprocess.run([sys.executable, script, sp + ".none", tp], capture_output=True).returncode != 0,
              "a missing snapshot refused")
        with open(sp, "wb") as f:
            pickle.dump({"segments": []}, f)
        out = subprocess.run([sys.executable, script, sp, tp], capture_output=True, text=True)
        check(out.returncode != 0 and "_record_memory_history" in out.stderr, "a snapshot without history refused")
        refused_snapshots(script, d)
        bounded_snapshots(script, d)
    print(f"test_snapshot_trace: {'ok' if not failed else f'{failed} failed'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

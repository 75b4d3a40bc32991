#!/usr/bin/env python3
"""snapshot_trace.py - a PyTorch memory snapshot as a fabpool trace, to replay a PyTorch run against fabpool.

    python3 perf/snapshot_trace.py [--device N] [--max-records N] [--max-bytes N] SNAPSHOT.pickle OUT.trace[.gz]

SNAPSHOT is what torch.cuda.memory._dump_snapshot writes after _record_memory_history: a pickle of plain dicts and
lists, read here without PyTorch. Its history of one device becomes a fabpool trace (include/fabpool_trace_format.h)
that fabpool_trace summarises and fabpool_replay replays against fabpool, cudaMallocAsync and PyTorch's allocators:

  alloc                      an application allocation (app_alloc) of the block's size on its stream
  free_completed             its free (app_free): when PyTorch could reuse the memory, after the work of every
                             stream the block was recorded on; a free requested and never completed stays live
  segment_alloc, _free       what PyTorch held (map and unmap records): cudaMalloc'd segments, and
  segment_map, _unmap        expandable segments' ranges, in 2 MiB pages so that every unmap names a map

The sizes are those PyTorch's allocator gave (rounded up to 512 bytes, or more with roundup_power2_divisions),
a little above what the program asked. The history is a ring of max_entries events: frees, unmaps and ends of
blocks allocated before it began are left out, and counted. The times are `time_us` where the snapshot has it.
Prints the peak live bytes, the peak PyTorch held and their ratio.

The snapshot is read by a restricted unpickler: a pickle can name any function to call while it is read, and a
snapshot is plain data (dicts, lists, tuples, strings, numbers, booleans, None), which pickle writes with opcodes
of its own and no name at all, so one that names anything (a class, os.system, even list or bytes, which called
with a size from the file would build objects of any size) is refused, never run. What it costs is bounded: the
file is read up to --max-bytes (default 1 GiB), the trace holds at most --max-records records (default 8 Mi;
each 2 MiB page a segment_map or segment_unmap names counts, written or not), and no map names more than a
device holds (1 TiB, at once or in one event); past a bound it stops with a message that names it. Every value
taken from it is checked (addresses and sizes in 64 bits, ranges that do not run past the end of the address
space, device 0 to 1023).
"""
import argparse
import gzip
import io
import math
import pickle
import struct
import sys

MAGIC = b"FPTRACE\0"
VERSION, HEADER_BYTES, RECORD_BYTES = 1, 64, 40
OP_MAP, OP_UNMAP, OP_APP_ALLOC, OP_APP_FREE = 10, 11, 7, 8
PAGE = 2 << 20  # PyTorch's expandable segments map whole pages of 2 MiB or multiples of it
FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 0x100000001B3
U64 = (1 << 64) - 1
MAX_DEVICE = 1023  # what the trace's readers take (perf/trace_file.h, TRACE_MAX_DEVICE)
MAX_BYTES = 1 << 30    # the snapshot file read at most (--max-bytes)
MAX_RECORDS = 1 << 23  # the trace's records at most, each page of a map or unmap counted (--max-records): 320 MiB
MAX_HELD = 1 << 40     # mapped at once, or in one event: more than any device holds
RECORD = struct.Struct("<QQQQBBHI")


class SnapshotError(Exception):
    """A snapshot that cannot be converted: the message says which value and why."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler of plain data: every name (a class, os.system, builtins.list, ...) is refused."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a memory snapshot never holds (it is plain "
                                     "data, pickled without a name); refused, not run (a pickle can call what it "
                                     "names while it is read): convert a snapshot that _dump_snapshot wrote")


def load_snapshot(path, max_bytes=MAX_BYTES):
    """The snapshot at path, read by PlainUnpickler from memory (a length in the file never sizes a read)."""
    with open(path, "rb") as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise SnapshotError(f"it is larger than --max-bytes ({max_bytes} bytes): raise --max-bytes to read a "
                            "snapshot this large that you trust")
    return PlainUnpickler(io.BytesIO(data)).load()


def shown(v):
    """v for a message: a few dozen characters whatever v is (its repr could be any size, or too long to make)."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 64:
        return f"an integer of {v.bit_length()} bits"
    if isinstance(v, (int, float, str, bool)) or v is None:
        return repr(v[:64] if isinstance(v, str) else v)
    return f"a {type(v).__name__}"


def u64(e, key, i, default=0):
    """Event i's field key as an unsigned 64-bit number (an int or a whole float), else SnapshotError."""
    v = e.get(key, default)
    if v is None:
        v = default
    if isinstance(v, float) and math.isfinite(v):
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= U64:
        raise SnapshotError(f"event {i} ({shown(e.get('action'))}): {key} is {shown(v)}, not a number of 0 to "
                            "2^64-1")
    return v


class Records:
    """The trace's records, packed as they come, and the bound on their number (each page of a map or unmap
    counted, written or not, so that no event costs more than the bound allows)."""

    def __init__(self, cap):
        self.body, self.n, self.cap, self.spent = bytearray(), 0, cap, 0

    def spend(self, k, i, action):
        self.spent += k
        if self.spent > self.cap:
            raise SnapshotError(f"event {i} ({action}) takes the trace past --max-records ({self.cap} records, each "
                                "2 MiB page of a map or unmap counted): raise --max-records to convert a snapshot "
                                "this large that you trust")

    def add(self, t, ptr, size, arg, op):
        self.body += RECORD.pack(t, ptr, size, arg, op, 0, 0, 1)
        self.n += 1


def fnv1a(h, data):
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def pages(addr, size):
    """A mapped range as the pages it is made of, where it is made of whole pages (made as they are taken)."""
    if addr % PAGE or size % PAGE:
        return ((addr, size),)
    return ((a, PAGE) for a in range(addr, addr + size, PAGE))


def page_count(addr, size):
    """How many (address, size) pairs pages() gives, and at least 1: what a map or unmap costs."""
    return 1 if addr % PAGE or size % PAGE else max(size // PAGE, 1)


def convert(events, max_records=MAX_RECORDS):
    """The trace's records (Records) from one device's events, and what was left out; SnapshotError past a bound."""
    recs, live, mapped = Records(max_records), {}, {}
    left = {"frees of blocks from before the history": 0, "unmaps of ranges from before it": 0, "oom events": 0}
    if not isinstance(events, list):
        raise SnapshotError(f"the device's history is a {type(events).__name__}, not a list of events")
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            raise SnapshotError(f"event {i} is a {type(e).__name__}, not a dict")
    t0 = next((u64(e, "time_us", i) for i, e in enumerate(events) if e.get("time_us") is not None), None)
    last = 0
    bytes_live = peak_live = bytes_held = peak_held = 0
    for i, e in enumerate(events):
        action, addr, size = e.get("action"), u64(e, "addr", i), u64(e, "size", i)
        if action in ("alloc", "segment_alloc", "segment_map", "segment_free", "segment_unmap") and size > U64 - addr:
            raise SnapshotError(f"event {i} ({action}): [0x{addr:x}, +{size}) runs past the end of the address space")
        if action in ("segment_alloc", "segment_map", "segment_free", "segment_unmap") and size > MAX_HELD:
            raise SnapshotError(f"event {i} ({action}): {size} bytes at 0x{addr:x}, more than any device holds "
                                f"({MAX_HELD} bytes): not a snapshot of a device's memory")
        t = (u64(e, "time_us", i) - t0) * 1000 if t0 is not None and e.get("time_us") is not None else i * 1000
        t = last = min(max(last, t), U64)  # time never goes back in a trace
        stream = u64(e, "stream", i)
        if action == "alloc":
            recs.spend(2 if addr in live else 1, i, action)
            if addr in live:  # a second alloc of a live address: the history lost its free
                recs.add(t, addr, 0, live[addr][1], OP_APP_FREE)
                bytes_live -= live.pop(addr)[0]
            live[addr] = (size, stream)
            bytes_live += size
            peak_live = max(peak_live, bytes_live)
            recs.add(t, addr, size, stream, OP_APP_ALLOC)
        elif action == "free_completed":
            if addr not in live:
                left["frees of blocks from before the history"] += 1
                continue
            recs.spend(1, i, action)
            size, stream = live.pop(addr)
            bytes_live -= size
            recs.add(t, addr, 0, stream, OP_APP_FREE)
        elif action in ("segment_alloc", "segment_map"):
            recs.spend(page_count(addr, size) if action == "segment_map" else 1, i, action)
            for a, n in pages(addr, size) if action == "segment_map" else [(addr, size)]:
                if a in mapped:
                    continue
                mapped[a] = n
                bytes_held += n
                recs.add(t, a, n, 0, OP_MAP)
            if bytes_held > MAX_HELD:
                raise SnapshotError(f"event {i} ({action}): {bytes_held} bytes mapped at once, more than any device "
                                    f"holds ({MAX_HELD} bytes): not a snapshot of a device's memory")
            peak_held = max(peak_held, bytes_held)
        elif action in ("segment_free", "segment_unmap"):
            recs.spend(page_count(addr, size) if action == "segment_unmap" else 1, i, action)
            for a, n in pages(addr, size) if action == "segment_unmap" else [(addr, size)]:
                if mapped.get(a) != n:
                    left["unmaps of ranges from before it"] += 1
                    continue
                del mapped[a]
                bytes_held -= n
                recs.add(t, a, n, 0, OP_UNMAP)
        elif action == "oom":
            left["oom events"] += 1
    return recs, left, peak_live, peak_held


def write_trace(path, recs, device):
    body = recs.body
    header = MAGIC + struct.pack("<IIIiQQQQII", VERSION, HEADER_BYTES, RECORD_BYTES, device, PAGE, 0, recs.n,
                                 fnv1a(FNV_OFFSET, body), 0, 0)
    assert len(header) == HEADER_BYTES and len(body) == RECORD_BYTES * recs.n
    with (gzip.open if path.endswith(".gz") else open)(path, "wb") as f:
        f.write(header)
        f.write(body)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--device", type=int, default=None,
                    help="the device whose history to take (default: the first that has one)")
    ap.add_argument("--max-records", type=int, default=MAX_RECORDS,
                    help=f"the most records the trace may hold, each 2 MiB page of a map or unmap counted "
                         f"(default {MAX_RECORDS})")
    ap.add_argument("--max-bytes", type=int, default=MAX_BYTES,
                    help=f"the largest snapshot file read (default {MAX_BYTES})")
    ap.add_argument("snapshot")
    ap.add_argument("out")
    a = ap.parse_args()
    if a.max_records < 1 or a.max_bytes < 1:
        ap.error("--max-records and --max-bytes take a number of 1 or more")
    try:
        snap = load_snapshot(a.snapshot, a.max_bytes)
    except (SnapshotError, OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            MemoryError, RecursionError) as e:
        sys.exit(f"snapshot_trace: cannot read '{a.snapshot}' as a PyTorch memory snapshot: {e}")
    traces = snap.get("device_traces") if isinstance(snap, dict) else None
    if not isinstance(traces, list):
        sys.exit(f"snapshot_trace: '{a.snapshot}' has no device_traces: record the history first "
                 "(torch.cuda.memory._record_memory_history) and dump it with _dump_snapshot")
    device = a.device if a.device is not None else next((d for d, t in enumerate(traces) if t), None)
    if device is None or not 0 <= device < len(traces) or not traces[device]:
        sys.exit(f"snapshot_trace: no history for device {device} in '{a.snapshot}' "
                 f"(devices with one: {[d for d, t in enumerate(traces) if t][:16]})")
    if device > MAX_DEVICE:
        sys.exit(f"snapshot_trace: device {device} in '{a.snapshot}': a trace's device is 0 to {MAX_DEVICE}")
    try:
        recs, left, peak_live, peak_held = convert(traces[device], a.max_records)
    except SnapshotError as e:
        sys.exit(f"snapshot_trace: '{a.snapshot}' is not a snapshot this converter takes: {e}")
    try:
        write_trace(a.out, recs, device)
    except OSError as e:
        sys.exit(f"snapshot_trace: cannot write '{a.out}': {e}")
    mib = 1 << 20
    print(f"{a.out}: device {device}, {recs.n} records from {len(traces[device])} events")
    print(f"peak live {peak_live / mib:.1f} MiB; PyTorch held {peak_held / mib:.1f} MiB at its peak"
          + (f" ({peak_held / peak_live:.3f}x)" if peak_live and peak_held else ""))
    for what, n in left.items():
        if n:
            print(f"left out: {n} {what}")


if __name__ == "__main__":
    main()

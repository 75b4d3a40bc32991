#!/usr/bin/env python3
"""check_memory_snapshot.py SNAPSHOT [CSV SVG EXPECTED.json] - what fabpool_trace --memory-snapshot / --csv / --plot
wrote from a trace, checked without PyTorch against what the program that made the trace knew.

The snapshot is read as torch.cuda._memory_viz reads it (pickle.load), but with an unpickler that refuses every
class, so that it holds only dicts, lists, tuples, ints, strings and booleans.  Its events are then replayed
forward as PyTorch's viewer replays them (MemoryViz.js: blocks inside the mapped segments, a free naming a live
block of the same size, an unmap naming mapped memory that holds no live block), and the state they end in must
be the "segments" list (each segment's blocks covering it exactly, as _memory_viz's segsum asserts).  EXPECTED
gives the device, the blocks live at the end, the bytes mapped at the end, the peaks of bytes in use and mapped:
the snapshot, the CSV and the plot must say the same.  With SNAPSHOT alone (a real run's), the snapshot's own
checks."""
import csv
import io
import json
import pickle
import sys
import xml.etree.ElementTree as ET

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)
        if len(failures) <= 20:
            print("FAILED:", what)


class PlainUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"the snapshot names a class ({module}.{name}): only plain values belong there")


ACTIONS = {"alloc", "free_requested", "free_completed", "segment_map", "segment_unmap"}


def merge(ranges):
    """Sorted (address, size) ranges with the adjacent ones joined."""
    out = []
    for a, n in sorted(ranges):
        if out and out[-1][0] + out[-1][1] == a:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((a, n))
    return out


def covered(ranges, a, n):
    """Whether [a, a + n) lies inside the union of ranges."""
    return any(s <= a and a + n <= s + m for s, m in merge(ranges))


def replay(events):
    """The events forward: (live blocks at the end, mapped ranges at the end, peak in use, peak mapped).  Segments
    are mapped and unmapped as expandable segments are: any range, joined with its neighbours."""
    live, mapped = {}, []
    maps = any(e.get("action") == "segment_map" for e in events)  # a trace without map records has none
    in_use = peak_use = peak_map = 0
    last_t = -1
    pending = None
    for i, e in enumerate(events):
        where = f"event {i} {e}"
        check(set(e) >= {"action", "addr", "size", "stream", "frames", "time_us"}, f"{where}: fields missing")
        check(e["action"] in ACTIONS, f"{where}: an action the viewer does not know")
        check(all(isinstance(e[k], int) and e[k] >= 0 for k in ("addr", "size", "stream", "time_us")),
              f"{where}: not whole numbers")
        check(e["frames"] == [], f"{where}: frames a trace cannot have")
        check(e["time_us"] >= last_t, f"{where}: time goes back")
        last_t = e["time_us"]
        a, n, act = e["addr"], e["size"], e["action"]
        if pending is not None:
            check(act == "free_completed" and (a, n) == pending, f"{where}: free_requested not completed at once")
            pending = None
        if act == "alloc":
            check(a not in live, f"{where}: allocated twice")
            check(not maps or covered(mapped, a, n), f"{where}: a block outside the mapped memory")
            check(all(a + n <= b or b + m <= a for b, m in live.items()), f"{where}: overlaps a live block")
            live[a] = n
            in_use += n
        elif act == "free_requested":
            check(live.get(a) == n, f"{where}: frees what is not a live block of that size")
            pending = (a, n)
        elif act == "free_completed":
            if live.pop(a, None) is not None:
                in_use -= n
        elif act == "segment_map":
            check(all(a + n <= b or b + m <= a for b, m in mapped), f"{where}: maps mapped memory")
            mapped = merge(mapped + [(a, n)])
        elif act == "segment_unmap":
            check(covered(mapped, a, n), f"{where}: unmaps memory not mapped")
            check(all(b + m <= a or a + n <= b for b, m in live.items()), f"{where}: unmaps a live block")
            rest = []
            for b, m in mapped:
                if b < a:
                    rest.append((b, min(m, a - b)))
                if b + m > a + n:
                    rest.append((max(b, a + n), b + m - max(b, a + n)))
            mapped = merge(rest)
        peak_use, peak_map = max(peak_use, in_use), max(peak_map, sum(m for _, m in mapped))
    return live, mapped, peak_use, peak_map


def main():
    if len(sys.argv) not in (2, 5):
        sys.exit("usage: check_memory_snapshot.py SNAPSHOT [CSV SVG EXPECTED.json]")
    with open(sys.argv[1], "rb") as f:
        snap = PlainUnpickler(f).load()
    check(isinstance(snap, dict) and set(snap) >= {"segments", "device_traces"}, "not a snapshot dict")
    traces = snap["device_traces"]
    dev = len(traces) - 1
    check(dev >= 0 and not any(traces[:dev]), "device_traces: the events are not on one device, the last")
    live, mapped, peak_use, peak_map = replay(traces[dev])

    # the state the events end in is the segments list
    segs = snap["segments"]
    if any(e["action"] == "segment_map" for e in traces[dev]):
        check([(s["address"], s["total_size"]) for s in segs] == mapped,
              "the segments are not the memory mapped at the end")
    else:  # no map records: a segment a live block
        check(sorted((s["address"], s["total_size"]) for s in segs) == sorted(live.items()),
              "the segments are not the live blocks")
    active = {}
    for s in segs:
        check(s["device"] == dev and s["stream"] == 0 and s["segment_type"] in ("large", "small"), f"segment {s}")
        at = s["address"]
        for b in s["blocks"]:
            check(b["address"] == at and b["state"] in ("active_allocated", "inactive") and b["frames"] == [],
                  f"segment at {s['address']}: block {b} not where the one before ended")
            if b["state"] == "active_allocated":
                active[b["address"]] = b["size"]
                check(b["requested_size"] == b["size"], f"block {b}: its requested size")
            at += b["size"]
        check(at == s["address"] + s["total_size"], f"segment at {s['address']}: its blocks do not cover it")
        got = sum(b["size"] for b in s["blocks"] if b["state"] == "active_allocated")
        check(s["allocated_size"] == got == s["active_size"], f"segment at {s['address']}: allocated_size")
    check(active == live, "the segments' live blocks are not those the events leave live")

    if len(sys.argv) == 2:
        report(traces[dev], segs, live)
        return
    csv_path, svg_path, expected_path = sys.argv[2:5]
    want = json.load(open(expected_path))
    want_live = {int(a): n for a, n in want["live"].items()}
    check(dev == want["device"], f"the events are on device {dev}, not {want['device']}")

    # what the program knew
    check(live == want_live, f"live at the end: {sorted(live.items())}, the program held {sorted(want_live.items())}")
    got = sum(m for _, m in mapped)
    check(got == want["mapped"], f"mapped at the end: {got}, not {want['mapped']}")
    check(peak_use == want["in_use_peak"], f"peak in use: {peak_use}, the program's {want['in_use_peak']}")
    check(peak_map == want["mapped_peak"], f"peak mapped: {peak_map}, the pool's {want['mapped_peak']}")

    # the CSV says the same
    rows = list(csv.reader(open(csv_path)))
    check(rows and rows[0] == ["time_s", "event", "size", "in_use", "mapped"], f"CSV header {rows[:1]}")
    body = rows[1:]
    times = [float(r[0]) for r in body]
    check(times == sorted(times), "CSV: time goes back")
    check(max(int(r[3]) for r in body) == want["in_use_peak"], "CSV: peak in use")
    check(max(int(r[4]) for r in body) == want["mapped_peak"], "CSV: peak mapped")
    check(int(body[-1][3]) == sum(want_live.values()) and int(body[-1][4]) == want["mapped"], "CSV: the last row")
    n_blocks = sum(1 for e in traces[dev] if e["action"] in ("alloc", "free_completed"))
    check(sum(1 for r in body if r[1] in ("alloc", "free") or r[1].startswith("buffer_")) == n_blocks,
          "CSV: not one row an allocation or free of the snapshot")
    net = sum(int(r[2]) * (1 if r[1] == "map" else -1) for r in body if r[1] in ("map", "unmap"))
    check(net == want["mapped"], "CSV: the map and unmap rows do not add up to the bytes mapped")

    # the plot is SVG with both lines
    svg = ET.parse(svg_path).getroot()
    lines = [p for p in svg.iter("{http://www.w3.org/2000/svg}polyline")]
    check(len(lines) == 2 and all(len(p.get("points").split()) > 4 for p in lines), "the plot lacks its two lines")

    report(traces[dev], segs, live)


def report(events, segs, live):
    if failures:
        print(f"check_memory_snapshot: {len(failures)} FAILED")
        sys.exit(1)
    print(f"check_memory_snapshot: {len(events)} events, {len(segs)} segments, {len(live)} live blocks: consistent")


main()

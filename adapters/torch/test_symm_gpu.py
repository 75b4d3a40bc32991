"""fabpool_torch.SymmetricBuffer on real GPUs: ranks of a gloo group, each mapping the others' buffers.

    python3 test_symm_gpu.py --lib build/adapters/torch/libfabpool_torch.so [--ranks 4] [--devices 1]
                             [--steps 200] [--out symm.json]

--devices 1 puts every rank on GPU 0 (the peers' buffers come through POSIX fds of the same device);
--devices 2 puts rank r on GPU r % 2 (peers through NVLink).  Three phases, each over the same random
sizes (log-uniform between --min-mib and --max-mib):

1. fabpool: one SymmetricBuffer, resized at every step (each step one rank asks for the size, the others
   for half of it or 0: all get the largest).  At the start, two CUDA graphs are captured on every rank:
   A copies a slot into every peer's buffer at an offset inside the initial size (a memcpy node), B at
   an offset far past it (a kernel; those bytes are not mapped yet).  After every resize: the bytes of
   this rank's buffer below the old and new size kept their value; every rank fills its buffer with a
   value made of its rank and the step (a torch op) and reads every peer's through peer() tensors, all
   equal; graph A replays (and B wherever the size covers its offset) and every rank finds each peer's
   slot in its own buffer; no address moves (ptrs, ptrs_tensor).  Then close: the memory this process
   holds on its device (held.py, NVML) is back where it was before the buffer.
2. torch: a new torch.distributed._symmetric_memory buffer of each step's size (empty + rendezvous),
   timed against phase 1's resize; skipped (with the reason) where PyTorch refuses it.
3. fabpool fresh: a new SymmetricBuffer of each step's size (a pool, a buffer, the full exchange).
Rank 0 prints the per-step times (the slowest rank's) and a PASS/FAIL line per check, and writes them
to --out.  Exit code 0 only if every check passed."""
import argparse
import datetime
import json
import os
import random
import statistics
import sys
import tempfile
import time
import traceback

# before torch is imported here or in the ranks: PyTorch's symmetric memory may map several ranks on one
# device (phase 2 on one GPU), and NVLink multicast stays off
os.environ.setdefault("TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES", "1")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
SLOT = 1024                # int64 words each rank writes into each peer by graph
OFF_A = 64 << 10           # graph A: inside the initial size
OFF_B_FRACTION = 0.5       # graph B: at this fraction of max_bytes (about 1 step in 10 covers it)


def sizes_for(args):
    rng = random.Random(args.seed)
    lo, hi = args.min_mib * MIB, args.max_mib * MIB
    out = []
    for _ in range(args.steps):
        x = int(2 ** rng.uniform(lo.bit_length() - 1, hi.bit_length() - 1))
        out.append(max(lo, min(hi, x // 4096 * 4096)))
    return out


def summary(xs):
    xs = sorted(xs)
    if not xs:
        return {}
    return {"n": len(xs), "median_ms": statistics.median(xs) * 1e3, "mean_ms": statistics.fmean(xs) * 1e3,
            "p90_ms": xs[int(0.9 * (len(xs) - 1))] * 1e3, "max_ms": xs[-1] * 1e3}


def worker(rank, args, initfile):
    import torch
    import torch.distributed as dist
    sys.path.insert(0, os.path.join(HERE, "python"))
    sys.path.insert(0, HERE)
    os.environ["FABPOOL_TORCH_LIBRARY"] = os.path.abspath(args.lib)
    import fabpool_torch
    import held
    dev = torch.device("cuda", rank % args.devices)
    torch.cuda.set_device(dev)
    dist.init_process_group("gloo", init_method="file://" + initfile, rank=rank, world_size=args.ranks,
                            timeout=datetime.timedelta(seconds=120))
    group = dist.group.WORLD
    n = args.ranks
    checks = {}

    def check(name, ok, detail=""):
        prev = checks.get(name)
        if prev is None or prev[0]:
            checks[name] = (bool(ok), detail if not ok else "")

    def slowest(t):
        """The slowest rank's time (a gather, also a barrier)."""
        out = [None] * n
        dist.all_gather_object(out, t, group=group)
        return max(out)

    def settle():
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()
        dist.barrier(group)
        return held.own_free(dev.index)

    # warm-up: the kernels below loaded, so that their modules count in the baseline
    w = torch.zeros(4096, dtype=torch.int32, device=dev)
    w.fill_(1)
    bool(w.eq(1).all())
    torch.add(w, 0, out=w)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.copy_(w.flip(0))
    g.replay()
    del g, w
    free0 = settle()

    sizes = sizes_for(args)
    max_bytes = args.max_mib * MIB
    init = args.min_mib * MIB
    off_b = int(max_bytes * OFF_B_FRACTION) // 4096 * 4096
    slot_bytes = SLOT * 8
    report = {"rank": rank, "device": str(dev), "held_source": None}

    # ---- phase 1: one buffer, resized at every step
    rng = random.Random(args.seed * 31 + rank)
    t0 = time.perf_counter()
    buf = fabpool_torch.SymmetricBuffer(group, max_bytes, init, device=dev)
    report["create_ms"] = (time.perf_counter() - t0) * 1e3
    info = buf.info()
    report["handle_type"] = info["handle_type"]
    ptrs0 = list(buf.ptrs)
    table0 = buf.ptrs_tensor.cpu().tolist()
    check("ptrs_tensor equals ptrs", table0 == ptrs0, "%s vs %s" % (table0, ptrs0))
    src_a = torch.zeros(SLOT, dtype=torch.int64, device=dev)
    src_b = torch.zeros(SLOT, dtype=torch.int64, device=dev)
    dst_a = [buf.peer(q, torch.int64, (SLOT,), OFF_A + rank * slot_bytes) for q in range(n) if q != rank]
    dst_b = [buf.peer(q, torch.int64, (SLOT,), off_b + rank * slot_bytes, allow_unmapped=True)
             for q in range(n) if q != rank]
    graph_a, graph_b = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph_a):
        for d in dst_a:
            d.copy_(src_a)            # a memcpy node into mapped peer memory
    with torch.cuda.graph(graph_b):
        for d in dst_b:
            torch.add(src_b, 0, out=d)  # a kernel into peer memory that a later growth maps
    dist.barrier(group)

    def value(step, q):
        return (q + 1) * 1000003 + step

    times, kinds, replays_b = [], [], 0
    prev_size, prev_val = buf.size, None
    for step, target in enumerate(sizes):
        ask = target if step % n == rank else rng.choice((0, target // 2, target))
        dist.barrier(group)
        t0 = time.perf_counter()
        buf.resize(ask)
        dt = time.perf_counter() - t0
        times.append(slowest(dt))
        kinds.append("grow" if target > prev_size else "shrink" if target < prev_size else "same")
        size = buf.size
        check("size is the largest asked", size == target, "step %d: %d, expected %d" % (step, size, target))
        check("addresses never move", buf.ptrs == ptrs0 and buf.ptrs_tensor.cpu().tolist() == ptrs0,
              "step %d" % step)
        mine = buf.local(torch.int32, (size // 4,))
        if prev_val is not None:   # the bytes below both sizes kept their value
            keep = min(size, prev_size) // 4
            check("own bytes kept across resize", bool(mine[:keep].eq(prev_val).all()), "step %d" % step)
        val = value(step, rank)
        mine.fill_(val)
        torch.cuda.synchronize(dev)
        dist.barrier(group)
        for q in range(n):
            t = buf.peer(q, torch.int32, (size // 4,))
            check("every peer's buffer reads its rank", bool(t.eq(value(step, q)).all()),
                  "step %d: rank %d's buffer" % (step, q))
        dist.barrier(group)   # all have read before the graphs write into the buffers
        src_a.fill_(value(step, rank) * 10 + 1)
        src_b.fill_(value(step, rank) * 10 + 2)
        graph_a.replay()
        covers_b = size >= off_b + n * slot_bytes
        if covers_b:
            graph_b.replay()
            replays_b += 1
        torch.cuda.synchronize(dev)
        dist.barrier(group)
        for q in range(n):
            if q == rank:
                continue
            a = buf.local(torch.int64, (SLOT,), OFF_A + q * slot_bytes)
            check("graph A (captured at the start) wrote every peer's slot", bool(a.eq(value(step, q) * 10 + 1).all()),
                  "step %d: rank %d's slot" % (step, q))
            if covers_b:
                b = buf.local(torch.int64, (SLOT,), off_b + q * slot_bytes)
                check("graph B (captured before its bytes were mapped) wrote every peer's slot",
                      bool(b.eq(value(step, q) * 10 + 2).all()), "step %d: rank %d's slot" % (step, q))
        # the slots back to this rank's value: what the next step finds below both sizes
        mine[OFF_A // 4:(OFF_A + n * slot_bytes) // 4].fill_(val)
        if covers_b:
            mine[off_b // 4:(off_b + n * slot_bytes) // 4].fill_(val)
        torch.cuda.synchronize(dev)
        dist.barrier(group)
        prev_size, prev_val = size, val
    check("graph B replayed at least once", replays_b > 0, "the sizes never covered offset %d" % off_b)
    info = buf.info()
    report["fabpool"] = {"resize": summary(times),
                         "grow": summary([t for t, k in zip(times, kinds) if k == "grow"]),
                         "shrink": summary([t for t, k in zip(times, kinds) if k == "shrink"]),
                         "graph_b_replays": replays_b, "records_exported": info["records_exported"],
                         "records_imported": info["records_imported"], "exchanges": info["exchanges"]}
    del dst_a, dst_b, graph_a, graph_b, src_a, src_b, mine, t
    torch.cuda.synchronize(dev)
    dist.barrier(group)
    buf.close()
    free1 = settle()
    report["held_after_close"] = free0 - free1
    report["held_source"] = held.source
    check("nothing held after close (within 64 MiB)", abs(free0 - free1) <= 64 * MIB,
          "%d bytes (%s)" % (free0 - free1, held.source))

    # ---- phase 2: a new PyTorch symmetric-memory buffer at every step (within --budget-s)
    tsym = {"alloc": [], "free": []}
    err = None
    try:
        import torch.distributed._symmetric_memory as symm_mem
        if hasattr(symm_mem, "set_backend"):
            try:
                symm_mem.set_backend("CUDA")
            except Exception:  # noqa: BLE001 - the default backend stays
                pass
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            symm_mem.enable_symm_mem_for_group(group.group_name)
    except Exception as e:  # noqa: BLE001
        err = "%s: %s" % (type(e).__name__, e)
    t_phase = time.perf_counter()
    for step, target in enumerate(sizes):
        res = None
        if err is None:
            try:
                dist.barrier(group)
                t0 = time.perf_counter()
                t = symm_mem.empty(target, dtype=torch.uint8, device=dev)
                h = symm_mem.rendezvous(t, group)
                torch.cuda.synchronize(dev)
                dt_alloc = time.perf_counter() - t0
                if step == 0:   # it works: every rank reads its peers' byte
                    t.fill_(rank + 1)
                    torch.cuda.synchronize(dev)
                    dist.barrier(group)
                    for q in range(n):
                        pb = h.get_buffer(q, (1,), torch.uint8)
                        check("torch symmetric memory reads every peer", int(pb.item()) == q + 1, "rank %d" % q)
                    dist.barrier(group)
                t0 = time.perf_counter()
                del h, t
                torch.cuda.synchronize(dev)
                res = (dt_alloc, time.perf_counter() - t0, time.perf_counter() - t_phase)
            except Exception as e:  # noqa: BLE001
                err = "step %d: %s: %s" % (step, type(e).__name__, (str(e).splitlines() or [""])[0])
        outs = [None] * n
        dist.all_gather_object(outs, res, group=group)
        if any(o is None for o in outs):
            err = err or "another rank failed (rank 0 says why)"
            break
        tsym["alloc"].append(max(o[0] for o in outs))
        tsym["free"].append(max(o[1] for o in outs))
        if outs[0][2] > args.budget_s:
            err = "stopped after %d steps: past the time budget (%d s)" % (step + 1, args.budget_s)
            break
    report["torch_symm"] = {"error": err, "alloc_rendezvous": summary(tsym["alloc"]), "free": summary(tsym["free"]),
                            "steps": len(tsym["alloc"])}

    # ---- phase 3: a new fabpool SymmetricBuffer at every step (pool, buffer, full exchange)
    fresh = []
    t_phase = time.perf_counter()
    for target in sizes:
        dist.barrier(group)
        t0 = time.perf_counter()
        b = fabpool_torch.SymmetricBuffer(group, target, target, device=dev, conf="handle_type:%s" %
                                          report["handle_type"])
        dt = time.perf_counter() - t0
        b.close()
        fresh.append(slowest(dt))
        if slowest(time.perf_counter() - t_phase if rank == 0 else 0.0) > args.budget_s:
            break
    report["fabpool_fresh"] = {"create": summary(fresh)}
    free2 = settle()
    report["held_at_end"] = free0 - free2
    report["checks"] = {k: {"ok": v[0], "detail": v[1]} for k, v in checks.items()}
    out = [None] * n
    dist.all_gather_object(out, report, group=group)
    dist.destroy_process_group()
    if rank == 0:
        with open(args.out_tmp, "w") as f:
            json.dump(out, f)


def entry(rank, args, initfile):
    try:
        worker(rank, args, initfile)
    except Exception:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--devices", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--min-mib", type=int, default=1)
    ap.add_argument("--max-mib", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=28)
    ap.add_argument("--budget-s", type=int, default=60, help="most seconds for each of phases 2 and 3")
    ap.add_argument("--out", default="symm-gpu.json")
    args = ap.parse_args()
    import torch
    import torch.multiprocessing as tmp
    if torch.cuda.device_count() < args.devices:
        print("FAIL: %d GPUs, %d asked" % (torch.cuda.device_count(), args.devices))
        return 1
    fd, initfile = tempfile.mkstemp(prefix="symm-gloo-")
    os.close(fd)
    os.unlink(initfile)
    args.out_tmp = args.out + ".ranks"
    t0 = time.time()
    ctx = tmp.spawn(entry, args=(args, initfile), nprocs=args.ranks, join=False)
    while not ctx.join(timeout=600):
        pass
    wall = time.time() - t0
    with open(args.out_tmp) as f:
        ranks = json.load(f)
    os.unlink(args.out_tmp)
    r0 = ranks[0]
    fails = 0
    names = sorted({k for r in ranks for k in r["checks"]})
    for k in names:
        bad = [(r["rank"], r["checks"][k]["detail"]) for r in ranks if k in r["checks"] and not r["checks"][k]["ok"]]
        fails += bool(bad)
        print("%s: %s%s" % ("FAIL" if bad else "PASS", k, (" " + str(bad[:3])) if bad else ""))
    fab, ts, fr = r0["fabpool"], r0["torch_symm"], r0["fabpool_fresh"]
    print("ranks %d on %d device(s), %s handles, %d steps between %d MiB and %d MiB, %.1f s" % (
        args.ranks, args.devices, r0["handle_type"], args.steps, args.min_mib, args.max_mib, wall))
    print("fabpool resize (slowest rank):  median %.3f ms, p90 %.3f ms, max %.3f ms; grow median %.3f ms, shrink "
          "median %.3f ms; graph B replayed %d times" % (
              fab["resize"]["median_ms"], fab["resize"]["p90_ms"], fab["resize"]["max_ms"],
              fab["grow"].get("median_ms", 0), fab["shrink"].get("median_ms", 0), fab["graph_b_replays"]))
    if ts["alloc_rendezvous"]:
        print("torch symm new buffer (slowest rank): median %.3f ms, p90 %.3f ms, max %.3f ms; free median %.3f ms "
              "(%d steps)%s" % (ts["alloc_rendezvous"]["median_ms"], ts["alloc_rendezvous"]["p90_ms"],
                                ts["alloc_rendezvous"]["max_ms"], ts["free"].get("median_ms", 0), ts["steps"],
                                "; stopped: " + ts["error"] if ts["error"] else ""))
    else:
        print("torch symm: not run: %s" % ts["error"])
    print("fabpool fresh buffer + full exchange (slowest rank): median %.3f ms, p90 %.3f ms, max %.3f ms" % (
        fr["create"]["median_ms"], fr["create"]["p90_ms"], fr["create"]["max_ms"]))
    print("held after close (rank: bytes): %s; at the end: %s (%s)" % (
        [(r["rank"], r["held_after_close"]) for r in ranks], [(r["rank"], r["held_at_end"]) for r in ranks],
        r0["held_source"]))
    with open(args.out, "w") as f:
        json.dump({"args": {k: v for k, v in vars(args).items() if k != "out_tmp"}, "wall_s": wall, "ranks": ranks},
                  f, indent=1)
    print("%d passed, %d failed" % (len(names) - fails, fails))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())

"""PyTorch's allocator contract with fabpool installed, beside PyTorch's own allocator in the same run.  Needs
PyTorch and a GPU (the H200: adapters/torch/h200-contract.sh runs it).

Every case runs twice, each time in a process of its own (a case may fault, or leave the CUDA context dead): with
PyTorch's allocator, then with fabpool installed by a plain fabpool_torch.install() (mode cxx: the C++ allocator,
or the case fails).  The table compares the two; a case passes when fabpool behaves as PyTorch's allocator does:

  prefetch_fixed   a tensor made on a side stream, main.wait_stream(side), x.record_stream(main), freed while main
                   has yet to read it, then a tensor of the same size made on the side stream: wrong copies, for
                   4 KiB .. 64 MiB, 200 times each (0 wrong, no fault)
  prefetch_mixed   the same with sizes drawn from 4 KiB .. 64 MiB
  oom_probe        8 GiB tensors until refused: torch.OutOfMemoryError (the OOM observers called, fabpool's message),
                   then free them and a new tensor works
  fraction_cap     set_per_process_memory_fraction(0.25), then 4 GiB tensors until refused: as many as PyTorch's, and
                   the device's memory held never past the cap
  stats            memory_allocated, memory_reserved, max_memory_*, memory_stats, memory_summary,
                   reset_peak_memory_stats, empty_cache after a plain install, against the tensors made, from
                   Python and (fabpool) from C++ (CUDACachingAllocator::getDeviceStats, c10::getDeviceAllocator)
  graphs_one_pool  two CUDA graphs captured into one pool (pool=g1.pool()), replayed alternately, against eager
  reduce_overhead  torch.compile(mode="reduce-overhead") over three batch sizes against eager (CUDA graph trees:
                   checkPoolLiveAllocations and checkpoints)
  ipc_child        a 4 KiB and a 256 MiB tensor sent to a child process (torch.multiprocessing's pickler, spawn),
                   written there and read back; the parent lets go first and the child still reads them (the
                   memory stays held), then the child lets go and the memory is given back (held.py)

    python3 test_torch_contract.py --lib build/adapters/torch/libfabpool_torch.so [--out DIR] [--cases a,b]

Prints the table and PASS / FAIL per case, writes contract.json under --out, and exits 0 when no case fails."""
import argparse
import gc
import json
import os
import random
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 1 << 20
GIB = 1 << 30
CASES = ["prefetch_fixed", "prefetch_mixed", "oom_probe", "fraction_cap", "stats", "graphs_one_pool",
         "reduce_overhead", "ipc_child", "memory_history"]
TIMEOUT = {"reduce_overhead": 240, "oom_probe": 120, "ipc_child": 120}


# ------------------------------------------------------------------ the cases, in a child process

def setup(alloc, lib):
    """fabpool installed (before any CUDA call) where alloc says so; returns torch."""
    if alloc == "fabpool":
        sys.path.insert(0, os.path.join(HERE, "python"))
        import fabpool_torch
        fabpool_torch.install(lib, mode=os.environ.get("FABPOOL_TORCH_MODE", "cxx"))
    import torch
    return torch


def prefetch(torch, sizes):
    """The side-stream prefetch of timm's PrefetchLoader and many training loops; wrong copies per size."""
    dev = torch.device("cuda", 0)
    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()
    wrong = {}
    for n in sizes:
        wrong.setdefault(n, torch.zeros((), dtype=torch.int64, device=dev))
    for i, n in enumerate(sizes):
        v = i % 251
        with torch.cuda.stream(side):
            x = torch.full((n,), v, dtype=torch.uint8, device=dev)
        main.wait_stream(side)
        torch.cuda._sleep(1_000_000)      # main is busy: its read of x comes later
        out = torch.empty_like(x)
        out.copy_(x)
        x.record_stream(main)
        del x                              # freed while main has yet to read it
        with torch.cuda.stream(side):
            y = torch.full((n,), 255, dtype=torch.uint8, device=dev)   # the same size, on the side stream
        wrong[n] += (out != v).any()
        del y, out
    torch.cuda.synchronize()
    return {str(n): int(w) for n, w in wrong.items()}


def case_prefetch_fixed(torch, alloc):
    sizes = [4 << 10, 64 << 10, MIB, 16 * MIB, 64 * MIB]
    w = prefetch(torch, [n for n in sizes for _ in range(200)])
    return {"wrong": sum(w.values()), "wrong_by_size": w, "copies": 200 * len(sizes)}


def case_prefetch_mixed(torch, alloc):
    rng = random.Random(23)
    sizes = [rng.randint(4 << 10, 64 * MIB) for _ in range(1000)]
    w = prefetch(torch, sizes)
    return {"wrong": sum(w.values()), "copies": len(sizes)}


def case_oom_probe(torch, alloc):
    dev = torch.device("cuda", 0)
    seen = []
    attach = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
    if attach:
        attach(lambda device, size, allowed, free: seen.append((device, size)))
    live, err, kind = [], "", ""
    try:
        while len(live) < 64:
            live.append(torch.empty(8 * GIB, dtype=torch.uint8, device=dev))
    except torch.OutOfMemoryError as e:
        err, kind = str(e), type(e).__name__
    except Exception as e:   # anything else is a failure of the contract
        err, kind = str(e), type(e).__name__
    n = len(live)
    del live
    gc.collect()
    torch.cuda.synchronize()
    t = torch.ones(MIB, device=dev)
    went_on = float(t.sum()) == MIB
    return {"tensors": n, "exception": kind, "message": err.splitlines()[0][:400] if err else "",
            "observer_calls": len(seen), "observer_size": seen[0][1] if seen else 0, "went_on": went_on,
            "fabpool_message": "fabpool:" in err and ("this pool maps" in err or "pools map" in err)}


def case_fraction_cap(torch, alloc):
    import held
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    base = total - held.own_free(0)
    torch.cuda.set_per_process_memory_fraction(0.25, 0)
    cap = int(0.25 * total)
    live, kind, most = [], "", 0
    try:
        while len(live) < 64:
            live.append(torch.empty(4 * GIB, dtype=torch.uint8, device=dev))
            most = max(most, total - held.own_free(0) - base)
    except torch.OutOfMemoryError as e:
        kind = type(e).__name__
    reserved = torch.cuda.memory_reserved()
    used_after = total - held.own_free(0) - base
    n = len(live)
    del live
    gc.collect()
    return {"tensors": n, "exception": kind, "cap": cap, "reserved_at_refusal": reserved, "held_most": most,
            "held_after_refusal": used_after, "fraction": torch.cuda.get_per_process_memory_fraction(0)
            if hasattr(torch.cuda, "get_per_process_memory_fraction") else None}


def case_stats(torch, alloc):
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    r = {"backend": torch.cuda.memory.get_allocator_backend()}
    a = torch.randn(512, 512, device=dev)
    (a @ a).sum().item()    # cuBLAS's workspace comes from the allocator too
    del a
    torch.cuda.synchronize()
    base = torch.cuda.memory_stats()
    base_alloc = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    r["peak_reset"] = torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    sizes = [1000, 4096, MIB, 3 * MIB, 40 * MIB, 300 * MIB]
    ts = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
    s = torch.cuda.memory_stats()
    r["requested_delta"] = s["requested_bytes.all.current"] - base["requested_bytes.all.current"]
    r["requested_expected"] = sum(sizes)
    r["allocated_delta"] = torch.cuda.memory_allocated() - base_alloc
    r["reserved_ge_allocated"] = torch.cuda.memory_reserved() >= torch.cuda.memory_allocated()
    r["allocations_delta"] = s["allocation.all.current"] - base["allocation.all.current"]
    peak = torch.cuda.max_memory_allocated()
    r["summary_ok"] = "Allocated memory" in torch.cuda.memory_summary()
    if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "memory_allocated"):
        r["accelerator_same"] = torch.accelerator.memory_allocated() == torch.cuda.memory_allocated()
    if alloc == "fabpool":
        import fabpool_torch
        v = fabpool_torch.cpp_view(0)
        r["cpp"] = v
        r["cpp_same"] = (v["allocated"] == torch.cuda.memory_allocated() and
                         v["accelerator_allocated"] == v["allocated"] and v["reserved"] == torch.cuda.memory_reserved()
                         and v["get_allocator_is_fabpool"] and v["name_is_fabpool"])
    reserved_live = torch.cuda.memory_reserved()
    del ts
    gc.collect()
    torch.cuda.synchronize()
    r["peak_kept"] = torch.cuda.max_memory_allocated() == peak
    torch.cuda.empty_cache()
    r["freed_all"] = torch.cuda.memory_allocated() == base_alloc
    r["empty_cache_returned"] = torch.cuda.memory_reserved() < reserved_live
    torch.cuda.reset_peak_memory_stats()
    r["peak_reset_after"] = torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated()
    r["max_reserved_ge"] = torch.cuda.max_memory_reserved() >= torch.cuda.memory_reserved()
    return r


def case_graphs_one_pool(torch, alloc):
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    x = torch.randn(1024, 1024, device=dev)
    w = torch.randn(1024, 1024, device=dev)

    def f1():
        return torch.relu(x @ w).sum(1)

    def f2():
        return torch.sigmoid(x @ w.t() + 1).sum(0)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            f1(), f2()
    torch.cuda.current_stream().wait_stream(s)
    g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        y1 = f1()
    with torch.cuda.graph(g2, pool=g1.pool()):
        y2 = f2()
    worst = 0.0
    for i in range(20):
        x.copy_(torch.randn(1024, 1024, device=dev))
        (g1 if i % 2 == 0 else g2).replay()
        ref, got = (f1(), y1) if i % 2 == 0 else (f2(), y2)
        torch.cuda.synchronize()
        worst = max(worst, float((ref - got).abs().max() / (ref.abs().max() + 1e-6)))
    return {"replays": 20, "max_rel_diff": worst, "ok": worst < 1e-3}


def case_reduce_overhead(torch, alloc):
    dev = torch.device("cuda", 0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 512),
                                torch.nn.ReLU(), torch.nn.Linear(512, 256)).to(dev)
    compiled = torch.compile(model, mode="reduce-overhead")
    worst, runs = 0.0, 0
    t0 = time.time()
    with torch.no_grad():
        for bs in (8, 32, 96):
            for _ in range(4):
                torch.compiler.cudagraph_mark_step_begin()
                inp = torch.randn(bs, 256, device=dev)
                got = compiled(inp).clone()
                ref = model(inp)
                worst = max(worst, float((got - ref).abs().max() / (ref.abs().max() + 1e-6)))
                runs += 1
    torch.cuda.synchronize()
    r = {"runs": runs, "max_rel_diff": worst, "ok": worst < 1e-2, "seconds": round(time.time() - t0, 1)}
    try:
        from torch._dynamo.utils import counters
        r["cudagraph_skips"] = int(sum(counters["inductor"].get(k, 0) for k in counters["inductor"]
                                       if "cudagraph_skip" in k))
    except Exception:
        r["cudagraph_skips"] = None
    # the graph trees' pool: segments of a private pool in the snapshot
    try:
        segs = torch.cuda.memory_snapshot()
        r["private_pool_segments"] = sum(1 for sg in segs if tuple(sg.get("segment_pool_id", (0, 0))) != (0, 0))
    except Exception as e:
        r["private_pool_segments"] = "snapshot: %s" % str(e).splitlines()[0][:120]
    return r


def _ipc_child(conn, alloc, lib):
    """The child: fabpool installed as in the parent; the tensors from the parent, written, read again after the
    parent let go of them, then let go of here."""
    try:
        torch = setup(alloc, lib)
        from multiprocessing.reduction import ForkingPickler
        torch.cuda.init()
        torch.empty(1, device="cuda").add_(1)   # the context and the kernels loaded before the parent measures
        torch.cuda.synchronize()
        conn.send(("ready",))
        ts = [ForkingPickler.loads(b) for b in conn.recv()]
        for t in ts:
            t.add_(1)
        torch.cuda.synchronize()
        conn.send(("ok", [float(t[:1024].sum()) for t in ts]))
        conn.recv()                              # the parent has let go of its tensors
        sums = [float(t[:1024].sum()) for t in ts]
        del ts, t
        gc.collect()
        torch.cuda.synchronize()
        conn.send(("released", sums))
        conn.recv()                              # the parent has measured
    except Exception as e:
        conn.send(("error", "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])))


def case_ipc_child(torch, alloc, lib):
    """A small tensor (a slab block) and a 256 MiB one (a large block of several chunks) sent to a child process
    through torch.multiprocessing's pickler, written there and read back; the memory stays while the child
    holds the tensors after the parent let go, and is given back once both let go (held.py: what this process
    and its child use on the device)."""
    import held
    import torch.multiprocessing as mp
    from multiprocessing.reduction import ForkingPickler
    dev = torch.device("cuda", 0)
    base = torch.cuda.memory_allocated()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    p = ctx.Process(target=_ipc_child, args=(child, alloc, lib))
    p.start()

    def ask(what=None):
        try:
            if what is not None:
                parent.send(what)
            return parent.recv() if parent.poll(90) else ("error", "no answer from the child")
        except (OSError, EOFError) as e:   # the child is gone
            return ("error", "the child: %s" % e)

    res = {"shared": False}
    ready = ask()
    if ready[0] != "ready":
        p.join(30)
        return {"shared": False, "error": "child: %s" % (ready,)}
    w = torch.arange(1024, dtype=torch.float32, device=dev)   # the kernels loaded before the first reading
    bool(torch.equal(w + 1, w + 1)), float(w.sum())
    del w
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free0 = held.own_free(0)
    big_bytes = 256 * MIB
    tensors = [torch.arange(1024, dtype=torch.float32, device=dev),
               torch.arange(big_bytes // 4, dtype=torch.float32, device=dev)]
    torch.cuda.synchronize()
    try:
        data = [bytes(ForkingPickler.dumps(t)) for t in tensors]  # what torch.multiprocessing's queues do
    except Exception as e:
        p.terminate()
        p.join(30)
        return {"shared": False, "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:300])}
    res["shared"] = True
    got = ask(data)
    res["child"] = list(got)
    torch.cuda.synchronize()
    want = torch.arange(1024, dtype=torch.float32, device=dev) + 1
    res["written_back"] = all(bool(torch.equal(t[:1024], want)) for t in tensors)
    expect = float(want.sum())
    # the parent lets go first: its tensors deleted, its cache emptied
    del tensors, data, want
    gc.collect()
    torch.cuda.ipc_collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    res["held_while_child_holds_mib"] = round((free0 - held.own_free(0)) / MIB, 1)
    rel = ask("go")
    res["child_after_parent_let_go"] = list(rel)
    res["read_after_parent_let_go"] = rel[0] == "released" and all(x == expect for x in rel[1])
    torch.cuda.ipc_collect()   # the blocks PyTorch kept for the child (its IPC reference counts) go now
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    time.sleep(0.5)
    res["held_after_both_mib"] = round((free0 - held.own_free(0)) / MIB, 1)
    res["held_source"] = held.source
    try:
        parent.send("exit")
    except OSError:   # the child is gone already
        pass
    p.join(60)
    res["child_exit"] = p.exitcode
    res["allocated_back"] = torch.cuda.memory_allocated() == base
    # NVML's figures move in steps of the driver's own (2 MiB pages, its bookkeeping): 32 MiB of slack
    res["kept_while_child_holds"] = res["held_while_child_holds_mib"] >= big_bytes / MIB - 32
    res["freed"] = res["allocated_back"] and res["held_after_both_mib"] <= 32
    return res


def case_memory_history(torch, alloc):
    """torch.cuda.memory._record_memory_history, _snapshot and _memory_viz, as a user looks at a run's memory."""
    from torch.cuda import _memory_viz
    dev = torch.device("cuda", 0)
    torch.cuda.init()
    torch.cuda.memory._record_memory_history(max_entries=100000)
    sizes = [1000, 4096, MIB, 3 * MIB, 40 * MIB]
    ts = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
    addrs = [t.data_ptr() for t in ts]
    keep = ts.pop(0)
    del ts
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    r = {"backend": torch.cuda.memory.get_allocator_backend()}
    events = snap["device_traces"][0] if snap["device_traces"] else []
    allocs = {e["addr"] for e in events if e["action"] == "alloc"}
    done = {e["addr"] for e in events if e["action"] == "free_completed"}
    r["events"] = len(events)
    r["allocs_recorded"] = all(a in allocs for a in addrs)
    r["frees_recorded"] = all(a in done for a in addrs[1:]) and addrs[0] not in done
    r["stacks"] = all(e["frames"] for e in events if e["action"] == "alloc" and e["addr"] in addrs)
    times = [e["time_us"] for e in events]
    r["time_ordered"] = bool(times) and times == sorted(times)
    live = [b for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated"]
    r["live_in_segments"] = any(b["address"] == addrs[0] and b["frames"] for b in live)
    r["segsum"] = "total_reserved" in _memory_viz.segsum(snap)   # asserts that every segment adds up
    r["trace_plot_bytes"] = len(_memory_viz.trace_plot(snap))
    r["segment_plot_bytes"] = len(_memory_viz.segment_plot(snap))
    r["trace_text"] = "TOTAL MEM" in _memory_viz.trace(snap)
    torch.cuda.memory._record_memory_history(enabled=None)
    x = torch.empty(MIB, dtype=torch.uint8, device=dev)
    after = torch.cuda.memory._snapshot()
    r["off_records_nothing"] = not any(after["device_traces"])
    del x, keep
    r["ok"] = all(r[k] for k in ("allocs_recorded", "frees_recorded", "stacks", "time_ordered", "live_in_segments",
                                 "segsum", "trace_text", "off_records_nothing")) and r["trace_plot_bytes"] > 1000
    return r


def child(case, alloc, lib):
    try:
        torch = setup(alloc, lib)
        fn = globals()["case_" + case]
        res = fn(torch, alloc, lib) if case == "ipc_child" else fn(torch, alloc)
        res["status"] = "ran"
    except Exception as e:
        res = {"status": "error", "error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:400] if str(e) else ""),
               "trace": traceback.format_exc()[-2000:]}
    print("RESULT " + json.dumps(res), flush=True)
    return 0


# ------------------------------------------------------------------ the parent: both allocators, compared

def run(case, alloc, lib, env):
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", case, alloc, "--lib", lib],
                           capture_output=True, text=True, timeout=TIMEOUT.get(case, 90), env=env)
        out, rc = p.stdout, p.returncode
        err = p.stderr
    except subprocess.TimeoutExpired as e:
        out, rc, err = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or ""), "timeout", ""
    res = {"status": "no result"}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            res = json.loads(line[7:])
    res["rc"] = rc
    res["seconds"] = round(time.time() - t0, 1)
    if res["status"] != "ran":
        res["stderr_tail"] = (err or "")[-1500:]
    return res


def verdict(case, py, fp):
    """(PASS | FAIL, what fabpool did against PyTorch)."""
    def ran(r):
        return r.get("status") == "ran" and r.get("rc") == 0
    if not ran(fp):
        return "FAIL", "fabpool: %s (rc %s) %s" % (fp.get("status"), fp.get("rc"), fp.get("error", ""))
    if case.startswith("prefetch"):
        ok = fp["wrong"] == 0
        return ("PASS" if ok else "FAIL"), "wrong copies: PyTorch %s, fabpool %s of %s" % (
            py.get("wrong"), fp["wrong"], fp["copies"])
    if case == "oom_probe":
        ok = (fp["exception"] == "OutOfMemoryError" and fp["went_on"] and fp["fabpool_message"] and
              (fp["observer_calls"] >= 1 or py.get("observer_calls", 0) == 0) and
              abs(fp["tensors"] - py.get("tensors", fp["tensors"])) <= 1)
        return ("PASS" if ok else "FAIL"), "PyTorch: %s after %s, went on %s; fabpool: %s after %s (observer x%d), " \
            "went on %s: %s" % (py.get("exception"), py.get("tensors"), py.get("went_on"), fp["exception"],
                                fp["tensors"], fp["observer_calls"], fp["went_on"], fp["message"][:200])
    if case == "fraction_cap":
        slack = 512 * MIB   # the context and cuBLAS's workspace, outside the allocator
        ok = (fp["exception"] == "OutOfMemoryError" and fp["tensors"] == py.get("tensors") and
              fp["reserved_at_refusal"] <= fp["cap"] and fp["held_most"] <= fp["cap"] + slack)
        return ("PASS" if ok else "FAIL"), "4 GiB tensors before refused: PyTorch %s, fabpool %s; cap %.1f GiB, " \
            "fabpool reserved %.1f GiB, held at most %.1f GiB" % (py.get("tensors"), fp["tensors"], fp["cap"] / GIB,
                                                                  fp["reserved_at_refusal"] / GIB,
                                                                  fp["held_most"] / GIB)
    if case == "stats":
        keys = ["peak_reset", "reserved_ge_allocated", "summary_ok", "peak_kept", "freed_all",
                "empty_cache_returned", "peak_reset_after", "max_reserved_ge", "cpp_same"]
        bad = [k for k in keys if fp.get(k) is False]
        if fp["requested_delta"] != fp["requested_expected"]:
            bad.append("requested %d != %d" % (fp["requested_delta"], fp["requested_expected"]))
        if not (fp["requested_expected"] <= fp["allocated_delta"] <= 1.25 * fp["requested_expected"] + 4096 * 6):
            bad.append("allocated %d" % fp["allocated_delta"])
        if fp.get("accelerator_same") is False:
            bad.append("accelerator")
        if fp.get("cpp_same") is None:
            bad.append("no C++ view")
        return ("PASS" if not bad else "FAIL"), "backend %s; %s" % (fp["backend"], "all hold" if not bad else bad)
    if case == "graphs_one_pool":
        return ("PASS" if fp["ok"] else "FAIL"), "max relative difference against eager: PyTorch %s, fabpool %s" % (
            py.get("max_rel_diff"), fp["max_rel_diff"])
    if case == "reduce_overhead":
        ok = fp["ok"] and not fp.get("cudagraph_skips") and (
            not isinstance(fp.get("private_pool_segments"), int) or fp["private_pool_segments"] > 0)
        return ("PASS" if ok else "FAIL"), "matches eager (max rel diff %.2g), cudagraph skips %s, private pool " \
            "segments %s, %s s (PyTorch %s s)" % (fp["max_rel_diff"], fp.get("cudagraph_skips"),
                                                  fp.get("private_pool_segments"), fp["seconds"], py.get("seconds"))
    if case == "ipc_child":
        if not fp.get("shared"):
            return "FAIL", fp.get("error", "")
        keys = ["written_back", "read_after_parent_let_go", "kept_while_child_holds", "freed"]
        ok = fp["child"][0] == "ok" and fp["child_exit"] == 0 and all(fp[k] for k in keys)
        return ("PASS" if ok else "FAIL"), "child %s; %s; held while the child holds: fabpool %s MiB (PyTorch %s), " \
            "after both let go: fabpool %s MiB (PyTorch %s), %s" % (
                fp["child"][0], ", ".join("%s %s" % (k, fp[k]) for k in keys), fp["held_while_child_holds_mib"],
                py.get("held_while_child_holds_mib"), fp["held_after_both_mib"], py.get("held_after_both_mib"),
                fp["held_source"])
    if case == "memory_history":
        keys = ["allocs_recorded", "frees_recorded", "stacks", "time_ordered", "live_in_segments", "segsum",
                "trace_text", "off_records_nothing"]
        return ("PASS" if fp["ok"] else "FAIL"), "backend %s, %d events (PyTorch %s); %s; HTML %d bytes" % (
            fp["backend"], fp["events"], py.get("events"), ", ".join("%s %s" % (k, fp[k]) for k in keys),
            fp["trace_plot_bytes"])
    return "FAIL", "unknown case"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.environ.get("FABPOOL_TORCH_LIBRARY"))
    ap.add_argument("--out", default=".")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--child", nargs=2, metavar=("CASE", "ALLOC"))
    args = ap.parse_args()
    if args.child:
        return child(args.child[0], args.child[1], args.lib)
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE, os.path.join(HERE, "python"), env.get("PYTHONPATH", "")])
    env.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(os.path.abspath(args.out), "inductor-cache"))
    results, rows, failed = {}, [], 0
    for case in args.cases.split(","):
        py = run(case, "pytorch", args.lib, env)
        fp = run(case, "fabpool", args.lib, env)
        v, what = verdict(case, py, fp)
        failed += v == "FAIL"
        results[case] = {"pytorch": py, "fabpool": fp, "verdict": v, "what": what}
        rows.append((case, v, what))
        print("%-5s %-16s %s" % (v, case, what), flush=True)
        if v == "FAIL":
            for side, r in (("pytorch", py), ("fabpool", fp)):
                if r.get("status") != "ran" or r.get("rc") != 0:
                    print("      %s: %s\n%s" % (side, r.get("error", r.get("status")),
                                               r.get("trace", r.get("stderr_tail", ""))), flush=True)
    with open(os.path.join(args.out, "contract.json"), "w") as f:
        json.dump(results, f, indent=1)
    print("\n| case | verdict | what |\n| --- | --- | --- |")
    for case, v, what in rows:
        print("| %s | %s | %s |" % (case, v, what.replace("|", "/")))
    print("CONTRACT %s (%d failed of %d)" % ("PASS" if not failed else "FAIL", failed, len(rows)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Pause and resume of an RL workload: torch_memory_saver (the original, hook
mode "torch") against fabpool_memory_saver, each in a process of its own on
the same GPU, then their medians side by side.

The workload: weights with CPU backup (tensors of many sizes, --weights-gib
in all) and a KV cache without (--kv-gib, a few tensors), allocated inside
regions; then --cycles rounds of pause() and resume().  Measured in each
process:
  alloc_s          allocating the workload inside the regions (each
                   allocator's segments made from nothing)
  alloc_p50_us     the median time of one torch.empty inside a region
  held_overhead    device memory taken by the allocations over the bytes
                   asked for (mem_get_info), as a fraction
  pause_s, resume_s  per cycle; medians printed
  offload_GBps     the weights' bytes / pause_s, against
  memcpy_d2h_GBps, memcpy_h2d_GBps  a plain copy of the same bytes between a
                   device tensor and a pinned host tensor in the same process
  given_back_GiB   device memory given back by a pause
  bitwise          every weight equal to its reference after every cycle
  rss_delta_MiB    the process's resident memory after the cycles against
                   before them (the host copies must be gone; fabpool's
                   pinned staging ring, staging_MiB in the JSON, is in it)
  region_enter_s, first_alloc_us  (JSON only) the one-time set-up: entering
                   each region, the first allocation in each
  phases           (JSON only, fabpool) where a pause and a resume go: the
                   medians over the cycles of the module's host mappings,
                   copies each way, sleeps, wakes and host unmaps (seconds
                   a cycle), and the copies' own bandwidth (offload_copy_GBps,
                   restore_copy_GBps: bytes / time in the staged copies)
  alloc_us         (JSON only) one torch.empty inside a region: p50, p90, max,
                   mean (the mean counts the allocations that made segments)
  reask_mean_us, reask_p50_us  torch.empty inside a region for sizes asked
                   before: --rounds rounds of {24 tensors of 1-64 MiB of new
                   sizes, freed, torch.cuda.empty_cache()}, each torch.empty
                   timed; reask_segments_made (JSON) the segments PyTorch
                   asked its backend for in each round (a region's MemPool
                   keeps its segments: after two rounds PyTorch's cache
                   serves every size, for both backends)
  backend_first_us, backend_again_us  the backend alone, called as a region's
                   MemPool calls it for a segment: --rounds rounds of {24
                   segments of 2-64 MiB, then all freed}; the median of round
                   1 (nothing held) and of the later rounds (sizes freed
                   before: torch_memory_saver creates and maps each segment
                   again, fabpool's pool has the memory); backend_free_us the
                   frees
  retained_pause_s, retained_copy_GBps  (fabpool) --retained-cycles more
                   cycles with retain_cpu_backup on: the pause's copies go
                   into host pages kept from the cycle before (no fresh pages
                   for the kernel to zero); medians of those after the first
  stage_ring, stage_release  (JSON phases, fabpool) pinning the staging ring
                   at a pause and unpinning it at the resume, seconds a cycle
                   (offload_copy_GBps leaves stage_ring out); staging_after_MiB
                   the ring still pinned after the cycles (0 unless
                   FABPOOL_STAGE_KEEP=1), populated_GiB the host bytes the
                   lanes faulted in ahead of their memcpy, uffd_GiB those
                   they installed by UFFDIO_COPY (FABPOOL_STAGE_UFFD=1)

--api cumem: vLLM's CuMemAllocator API (fabpool_cumem; no upstream here): the
same weights in use_memory_pool(tag="weights"), the KV cache in
use_memory_pool(tag="kv_cache"), then --cycles rounds of
sleep(offload_tags=("weights",)) and wake_up(), once with the offload through
the staging ring (staged, the default) and once with the library's offload
into pinned host memory (pinned, FABPOOL_CUMEM_OFFLOAD=pinned), each in a
process of its own: sleep_s and wake_s medians, offload_GBps (weights /
sleep), offload_copy_GBps and restore_copy_GBps (staged: the ring's copies
alone) beside the plain pinned copy, given_back_GiB, bitwise, rss_delta_MiB,
staging_after_MiB; phases (JSON) as above, the pinned mode's copies inside
its sleep and wake.

Usage: rl_pause_resume.py --lib DIR [--tms DIR] [--weights-gib 3] [--kv-gib 2]
                          [--cycles 5] [--rounds 5] [--retained-cycles 3] [--json OUT]
       rl_pause_resume.py --api cumem --lib DIR [--weights-gib 3] [--kv-gib 2] [--cycles 5] [--json OUT]
  DIR of --lib holds libfabpool_torch.so and fabpool_memory_saver.py (a
  build's adapters/torch); --tms is a torch_memory_saver checkout whose
  torch-mode library is built (left out: fabpool alone).
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

GiB = 1 << 30
MiB = 1 << 20


def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def weight_sizes(total, seed=1):
    """Sizes from 4 KiB to 256 MiB, log-uniform, odd ones among them, up to total bytes."""
    rng = random.Random(seed)
    out, acc = [], 0
    while acc < total:
        n = int(2 ** rng.uniform(12, 28)) + rng.choice((0, 0, 1, 100, 4095))
        n = min(n, total - acc) if total - acc > 4096 else total - acc
        out.append(n)
        acc += n
    return out


def reask_rounds(torch, tms, dev, rounds, seed=11):
    """Allocation inside a region where the backend is asked again: `rounds` rounds of {tensors of 1-64 MiB
    of new sizes allocated, freed, torch.cuda.empty_cache()}, as RL frameworks do between phases; each
    torch.empty timed.  segments_made counts the segments PyTorch asked its backend for in each round
    (memory_stats' segment.all.allocated): 0 means PyTorch's own cache served the round."""
    rng = random.Random(seed)
    lat, made = [], []
    stats = lambda: torch.cuda.memory_stats().get("segment.all.allocated", 0)   # noqa: E731
    with tms.region(tag="kv_cache"):
        for _ in range(rounds):
            s0 = stats()
            ts = []
            for _ in range(24):
                n = rng.randint(1 * MiB, 64 * MiB)
                t = time.perf_counter()
                ts.append(torch.empty(n, dtype=torch.uint8, device=dev))
                lat.append(time.perf_counter() - t)
            made.append(stats() - s0)
            del ts
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return {"reask_mean_us": statistics.mean(lat) * 1e6, "reask_p50_us": statistics.median(lat) * 1e6,
            "reask_max_us": max(lat) * 1e6, "reask_segments_made": made, "reask_allocs": len(lat)}


def backend_rounds(torch, tms, impl, rounds, seed=13):
    """The backend alone inside a region, called as a region's MemPool calls it for a segment (PyTorch rounds
    segments to 2 MiB): `rounds` rounds of {24 segments of 2-64 MiB allocated, then all freed}, each call timed.
    Round 1 finds nothing held; later rounds ask for memory freed before."""
    import ctypes as ct
    rng = random.Random(seed)
    idx = torch.cuda.current_device()
    stream = ct.c_void_p(torch.cuda.current_stream().cuda_stream)
    first, again, frees = [], [], []
    with tms.region(tag="backend"):
        if impl == "fabpool":
            import fabpool_torch as ft
            lib = ft._tags_lib()
            k = ft.tag_slot("backend", idx)
            alloc, free = getattr(lib, "fabpool_torch_tag%d_alloc" % k), getattr(lib, "fabpool_torch_tag%d_free" % k)
        else:
            lib = tms._impl._binary_wrapper.cdll
            alloc, free = lib.tms_torch_malloc, lib.tms_torch_free
        alloc.restype, alloc.argtypes = ct.c_void_p, [ct.c_ssize_t, ct.c_int, ct.c_void_p]
        free.restype, free.argtypes = None, [ct.c_void_p, ct.c_ssize_t, ct.c_int, ct.c_void_p]
        for r in range(rounds):
            got = []
            for _ in range(24):
                n = rng.randint(1, 32) * 2 * MiB
                t = time.perf_counter()
                ptr = alloc(n, idx, stream)
                (first if r == 0 else again).append(time.perf_counter() - t)
                if not ptr:
                    raise RuntimeError("%s: the backend refused a segment of %d bytes" % (impl, n))
                got.append((ptr, n))
            for ptr, n in got:
                t = time.perf_counter()
                free(ptr, n, idx, stream)
                frees.append(time.perf_counter() - t)
            torch.cuda.synchronize()
    return {"backend_first_us": statistics.median(first) * 1e6,
            "backend_again_us": statistics.median(again) * 1e6 if again else None,
            "backend_free_us": statistics.median(frees) * 1e6}


def retained_cycles(torch, tms, weights, refs, phases, cycles):
    """fabpool: `cycles` + 1 pause/resume cycles with retain_cpu_backup on (the first makes the host copies that
    the others copy into again), then one with it off, which gives the copies back.  Medians over all but the
    first."""
    tms.retain_cpu_backup = True
    pause, copy, ok = [], [], True
    for c in range(cycles + 1):
        for v in phases.values():
            v.append(0.0)
        torch.cuda.synchronize()
        t = time.perf_counter()
        tms.pause()
        torch.cuda.synchronize()
        if c:
            pause.append(time.perf_counter() - t)
            copy.append(phases.get("copy_d2h", [0.0])[-1] - phases.get("stage_ring", [0.0])[-1])
        tms.resume()
        torch.cuda.synchronize()
        ok = ok and all(torch.equal(w, r) for w, r in zip(weights, refs))
    tms.retain_cpu_backup = False
    tms.pause()
    tms.resume()
    torch.cuda.synchronize()
    ok = ok and all(torch.equal(w, r) for w, r in zip(weights, refs))
    wbytes = sum(w.numel() for w in weights)
    return {"retained_pause_s": statistics.median(pause), "retained_bitwise": ok,
            "retained_copy_GBps": wbytes / statistics.median(copy) / 1e9 if min(copy) > 0 else None}


def time_backend(be, phases):
    """Wraps the backend's host mappings, copies, sleeps, wakes and ring (fabpool_stage's) so that each call
    adds its seconds to phases[name][-1] (the cycle running now)."""
    for name in ("host_alloc", "copy", "sleep", "wake", "host_free", "_ring", "release_staging"):
        def timed(*a, _f=getattr(be, name), _n=name, **k):
            t = time.perf_counter()
            try:
                return _f(*a, **k)
            finally:
                key = {"_ring": "stage_ring", "release_staging": "stage_release"}.get(_n, _n)
                if _n == "copy":
                    key = "copy_d2h" if k.get("to_host", a[-1] if a else False) else "copy_h2d"
                phases.setdefault(key, [0.0])[-1] += time.perf_counter() - t
        setattr(be, name, timed)


def plain_copy(torch, dev, nbytes):
    """Seconds of three plain copies of nbytes each way between a device tensor and a pinned host tensor in
    this process (the host memory given back after)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    d2h, h2d = [], []
    for _ in range(3):
        torch.cuda.synchronize()
        t = time.perf_counter()
        host.copy_(src)
        torch.cuda.synchronize()
        d2h.append(time.perf_counter() - t)
        t = time.perf_counter()
        src.copy_(host)
        torch.cuda.synchronize()
        h2d.append(time.perf_counter() - t)
    del src, host
    torch.cuda.empty_cache()
    if hasattr(torch._C, "_host_emptyCache"):
        torch._C._host_emptyCache()
    return d2h, h2d


def copy_rates(out, phases, cycles, wbytes):
    """The phases' medians over the cycles into out["phases"], and the copies' own bandwidth."""
    # a phase first seen in cycle c has c fewer entries: the cycles before it spent nothing there
    med = {k: statistics.median([0.0] * (cycles - len(v)) + v) for k, v in phases.items()}
    out["phases"] = med
    for k, key in (("copy_d2h", "offload_copy_GBps"), ("copy_h2d", "restore_copy_GBps")):
        # the first copies pin the staging ring first (stage_ring): the copies' own time is without it
        t = med.get(k, 0.0) - (med.get("stage_ring", 0.0) if k == "copy_d2h" else 0.0)
        if t > 0:
            out[key] = wbytes / t / 1e9
    return med


def run_cycles(torch, used, weights, refs, kv, phases, n, down, up, differ):
    """n rounds of down() (pause, sleep) and up() (resume, wake_up), each timed to the device's idle; the cache
    written before each, as a serving engine would between phases, and the weights compared after.  Returns
    the seconds of each down and up, the device memory each down gave back, and whether every round was
    bitwise; differ (with %d for the round) is printed for a round that was not."""
    down_s, up_s, given, bitwise = [], [], [], True
    for c in range(n):
        for v in phases.values():
            v.append(0.0)
        for k in kv:
            k.fill_(c)
        torch.cuda.synchronize()
        before = used()
        t = time.perf_counter()
        down()
        torch.cuda.synchronize()
        down_s.append(time.perf_counter() - t)
        given.append(before - used())
        t = time.perf_counter()
        up()
        torch.cuda.synchronize()
        up_s.append(time.perf_counter() - t)
        ok = all(torch.equal(w, r) for w, r in zip(weights, refs))
        bitwise = bitwise and ok
        if not ok:
            print(differ % c, file=sys.stderr)
    torch.cuda.synchronize()
    return down_s, up_s, given, bitwise


def cycle_results(names, wbytes, down_s, up_s, d2h, h2d, given, bitwise, rss_delta):
    """The cycles' medians, the weights' bytes over them and over the plain copies: names are the JSON keys'
    words for the way down and up (pause, resume)."""
    down, up = names
    return {"%s_s" % down: statistics.median(down_s), "%s_s" % up: statistics.median(up_s),
            "%s_all_s" % down: down_s, "%s_all_s" % up: up_s,
            "offload_GBps": wbytes / statistics.median(down_s) / 1e9,
            "restore_GBps": wbytes / statistics.median(up_s) / 1e9,
            "memcpy_d2h_GBps": wbytes / statistics.median(d2h) / 1e9,
            "memcpy_h2d_GBps": wbytes / statistics.median(h2d) / 1e9,
            "given_back_GiB": statistics.median(given) / GiB,
            "bitwise": bitwise, "rss_delta_MiB": rss_delta / MiB}


def child(args):
    import torch
    if args.impl == "fabpool":
        sys.path.insert(0, args.lib)
        from fabpool_memory_saver import torch_memory_saver as tms
    else:
        sys.path.insert(0, args.tms)
        from torch_memory_saver import torch_memory_saver as tms
    tms.hook_mode = "torch"
    dev = torch.device("cuda")
    torch.cuda.init()
    torch.empty(1, device=dev)

    def used():
        f, t = torch.cuda.mem_get_info()
        return t - f

    phases = {}   # fabpool: name -> [seconds in this cycle, ...]
    if args.impl == "fabpool":
        be = tms._be()
        time_backend(be, phases)

    sizes = weight_sizes(int(args.weights_gib * GiB))
    kv_sizes = [int(args.kv_gib * GiB) // 4] * 4
    wbytes = sum(sizes)
    d2h, h2d = plain_copy(torch, dev, wbytes)

    # references (outside every region) and the workload (inside)
    g = torch.Generator(device=dev).manual_seed(7)
    refs = [torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev, generator=g) for n in sizes]
    torch.cuda.synchronize()
    u0 = used()
    lat = []
    t0 = time.perf_counter()
    weights, kv = [], []
    enter = []
    t = time.perf_counter()
    with tms.region(tag="weights", enable_cpu_backup=True):
        enter.append(time.perf_counter() - t)
        for n in sizes:
            t = time.perf_counter()
            weights.append(torch.empty(n, dtype=torch.uint8, device=dev))
            lat.append(time.perf_counter() - t)
    t = time.perf_counter()
    with tms.region(tag="kv_cache"):
        enter.append(time.perf_counter() - t)
        for n in kv_sizes:
            t = time.perf_counter()
            kv.append(torch.empty(n, dtype=torch.uint8, device=dev))
            lat.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    alloc_s = time.perf_counter() - t0
    held = used() - u0
    asked = wbytes + sum(kv_sizes)
    for w, r in zip(weights, refs):
        w.copy_(r)
    torch.cuda.synchronize()
    rss0 = rss()

    phases.clear()
    pause_s, resume_s, given, bitwise = run_cycles(torch, used, weights, refs, kv, phases, args.cycles,
                                                   tms.pause, tms.resume,
                                                   "%s: cycle %%d: weights differ after resume" % args.impl)
    rss1 = rss()
    # the phases' medians over the cycles above, before the cycles below add to them
    rates = {}
    if phases:
        copy_rates(rates, phases, args.cycles, wbytes)
    reask = reask_rounds(torch, tms, dev, args.rounds)
    reask.update(backend_rounds(torch, tms, args.impl, args.rounds))
    if args.impl == "fabpool" and args.retained_cycles > 0:
        reask.update(retained_cycles(torch, tms, weights, refs, phases, args.retained_cycles))
        bitwise = bitwise and reask["retained_bitwise"]
    out = {
        "impl": args.impl, "weights": len(sizes), "weights_bytes": wbytes, "kv_bytes": sum(kv_sizes),
        "alloc_s": alloc_s, "alloc_p50_us": statistics.median(lat) * 1e6,
        "held_overhead": (held - asked) / asked,
        **cycle_results(("pause", "resume"), wbytes, pause_s, resume_s, d2h, h2d, given, bitwise, rss1 - rss0),
        # where the one-time set-up goes: entering each region (its pool made there), each region's first
        # allocation; and the pinned staging ring fabpool keeps for the process (in rss_delta_MiB)
        "region_enter_s": enter, "first_alloc_us": [lat[0] * 1e6, lat[len(sizes)] * 1e6],
        "staging_MiB": (tms.staging_bytes() / MiB) if hasattr(tms, "staging_bytes") else 0.0,
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
        "alloc_us": {"p50": statistics.median(lat) * 1e6, "p90": sorted(lat)[int(0.9 * len(lat))] * 1e6,
                     "max": max(lat) * 1e6, "mean": statistics.mean(lat) * 1e6},
        "stage_env": {k: os.environ.get(k) for k in ("FABPOOL_STAGE_LANES", "FABPOOL_STAGE_MIB",
                                                     "FABPOOL_STAGE_KEEP")},
        "staging_after_MiB": (tms.staging_bytes() / MiB) if hasattr(tms, "staging_bytes") else 0.0,
    }
    out.update(reask)
    if phases:
        out.update(rates)
        out["populated_GiB"] = be.populated_bytes() / GiB if hasattr(be, "populated_bytes") else 0.0
        out["uffd_GiB"] = be.uffd_bytes() / GiB if hasattr(be, "uffd_bytes") else 0.0
    print(json.dumps(out))
    return 0 if bitwise else 1


def child_cumem(args):
    """--api cumem: the workload through fabpool_cumem's CuMemAllocator, offload mode args.impl."""
    import torch
    sys.path.insert(0, args.lib)
    from fabpool_cumem import CuMemAllocator
    alloc = CuMemAllocator.get_instance()
    alloc.offload = args.impl
    dev = torch.device("cuda")
    torch.cuda.init()
    torch.empty(1, device=dev)

    def used():
        f, t = torch.cuda.mem_get_info()
        return t - f

    phases = {}
    be = alloc._be()
    time_backend(be, phases)
    sizes = weight_sizes(int(args.weights_gib * GiB))
    kv_sizes = [int(args.kv_gib * GiB) // 4] * 4
    wbytes = sum(sizes)
    d2h, h2d = plain_copy(torch, dev, wbytes)
    g = torch.Generator(device=dev).manual_seed(7)
    refs = [torch.randint(0, 256, (n,), dtype=torch.uint8, device=dev, generator=g) for n in sizes]
    with alloc.use_memory_pool(tag="weights"):
        weights = [torch.empty(n, dtype=torch.uint8, device=dev) for n in sizes]
    with alloc.use_memory_pool(tag="kv_cache"):
        kv = [torch.empty(n, dtype=torch.uint8, device=dev) for n in kv_sizes]
    for w, r in zip(weights, refs):
        w.copy_(r)
    torch.cuda.synchronize()
    rss0 = rss()
    phases.clear()
    sleep_s, wake_s, given, bitwise = run_cycles(torch, used, weights, refs, kv, phases, args.cycles,
                                                 lambda: alloc.sleep(offload_tags=("weights",)), alloc.wake_up,
                                                 "cumem %s: cycle %%d: weights differ after wake_up" % args.impl)
    rss1 = rss()
    out = {
        "impl": args.impl, "weights": len(sizes), "weights_bytes": wbytes, "kv_bytes": sum(kv_sizes),
        **cycle_results(("sleep", "wake"), wbytes, sleep_s, wake_s, d2h, h2d, given, bitwise, rss1 - rss0),
        "staging_after_MiB": alloc.staging_bytes() / MiB, "host_after_MiB": alloc.host_bytes() / MiB,
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
        "stage_env": {k: os.environ.get(k) for k in ("FABPOOL_STAGE_LANES", "FABPOOL_STAGE_MIB",
                                                     "FABPOOL_STAGE_KEEP", "FABPOOL_CUMEM_OFFLOAD")},
    }
    copy_rates(out, phases, args.cycles, wbytes)
    if args.impl == "staged":
        out["offload_copy_ratio"] = out.get("offload_copy_GBps", 0.0) / out["memcpy_d2h_GBps"]
    print(json.dumps(out))
    return 0 if bitwise else 1


CUMEM_ROWS = [("sleep_s", "sleep(offload_tags=('weights',)), median (s)", "lower"),
              ("wake_s", "wake_up(), median (s)", "lower"),
              ("offload_GBps", "weights / sleep (GB/s)", "higher"),
              ("restore_GBps", "weights / wake_up (GB/s)", "higher"),
              ("offload_copy_GBps", "the sleep's copies alone (GB/s)", None),
              ("restore_copy_GBps", "the wake_up's copies alone (GB/s)", None),
              ("memcpy_d2h_GBps", "plain pinned copy D2H (GB/s)", None),
              ("memcpy_h2d_GBps", "plain pinned copy H2D (GB/s)", None),
              ("given_back_GiB", "device memory given back by a sleep (GiB)", None),
              ("rss_delta_MiB", "host memory after the cycles, against before (MiB)", None),
              ("staging_after_MiB", "staging ring pinned after the cycles (MiB)", None),
              ("bitwise", "weights bitwise after every cycle", None)]


def print_rows(results, have, rows):
    """One line a row: each column's value and, for two columns, the first one's gain over the second."""
    for key, label, better in rows:
        vals = [results[i].get(key) for i in have]
        if all(v is None for v in vals):
            continue
        ratio = ""
        if len(vals) == 2 and better and vals[0] and vals[1]:
            r = vals[1] / vals[0] if better == "lower" else vals[0] / vals[1]
            ratio = "%.2fx" % r
        fmt = lambda v: "-" if v is None else str(v) if isinstance(v, bool) else "%.4g" % v   # noqa: E731
        print("%-52s %14s %14s %s" % (label, *([fmt(v) for v in vals] + [""] * (2 - len(vals))), ratio))


def run_child(cmd, env=None):
    """The child's JSON line (None where it printed none), its rc and the end of its output."""
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, env=env)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    return (json.loads(lines[-1]) if lines else None), p.returncode, p.stdout[-2000:]


def main_cumem(args):
    """--api cumem: the staged offload (the default) and the library's pinned one, each in a process."""
    results, rc = {}, 0
    modes = ("staged", "pinned")
    for mode in modes:
        cmd = [sys.executable, os.path.abspath(__file__), "--api", "cumem", "--impl", mode, "--lib", args.lib,
               "--weights-gib", str(args.weights_gib), "--kv-gib", str(args.kv_gib), "--cycles", str(args.cycles)]
        res, prc, tail = run_child(cmd, env=dict(os.environ, FABPOOL_CUMEM_OFFLOAD=mode))
        if res is None:
            print("rl_pause_resume: cumem %s failed (rc %d) before its results: %s" % (mode, prc, tail))
            rc = 1
            continue
        results[mode] = res
        if not res["bitwise"] or prc != 0:
            rc = 1
    if not results:
        return 1
    first = next(iter(results.values()))
    print("rl_pause_resume --api cumem: %s, torch %s; weights %d tensors, %.2f GiB (offloaded); KV cache %.2f GiB "
          "(discarded); %d cycles" % (first["gpu"], first["torch"], first["weights"], first["weights_bytes"] / GiB,
                                     first["kv_bytes"] / GiB, args.cycles))
    have = [m for m in modes if m in results]
    print("%-52s %14s %14s %s" % ("", *(have + [""] * (2 - len(have))), "ratio (staged's gain)"))
    print_rows(results, have, CUMEM_ROWS)
    if "staged" in results and results["staged"].get("offload_copy_GBps"):
        print("the staged sleep's copies: %.2f of the plain pinned copy" % results["staged"]["offload_copy_ratio"])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return rc


ROWS = [("alloc_s", "allocating the workload in regions (s)", "lower"),
        ("alloc_p50_us", "one allocation, median (us)", "lower"),
        ("reask_mean_us", "torch.empty, sizes asked before, mean (us)", "lower"),
        ("reask_p50_us", "torch.empty, sizes asked before, median (us)", "lower"),
        ("backend_first_us", "the backend's segment, nothing held, median (us)", "lower"),
        ("backend_again_us", "the backend's segment, asked again, median (us)", "lower"),
        ("backend_free_us", "the backend's free of a segment, median (us)", "lower"),
        ("held_overhead", "device memory over the bytes asked for", None),
        ("pause_s", "pause, median (s)", "lower"),
        ("resume_s", "resume, median (s)", "lower"),
        ("offload_GBps", "weights / pause (GB/s)", "higher"),
        ("restore_GBps", "weights / resume (GB/s)", "higher"),
        ("offload_copy_GBps", "the pause's copies alone (GB/s)", None),
        ("retained_pause_s", "pause, host copies retained, median (s)", None),
        ("retained_copy_GBps", "its copies alone (GB/s)", None),
        ("restore_copy_GBps", "the resume's copies alone (GB/s)", None),
        ("memcpy_d2h_GBps", "plain pinned copy D2H (GB/s)", None),
        ("memcpy_h2d_GBps", "plain pinned copy H2D (GB/s)", None),
        ("given_back_GiB", "device memory given back by a pause (GiB)", None),
        ("rss_delta_MiB", "host memory after the cycles, against before (MiB)", None),
        ("bitwise", "weights bitwise after every cycle", None)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True)
    ap.add_argument("--tms")
    ap.add_argument("--api", choices=("tms", "cumem"), default="tms")
    ap.add_argument("--impl", choices=("fabpool", "upstream", "staged", "pinned"))
    ap.add_argument("--weights-gib", type=float, default=3.0)
    ap.add_argument("--kv-gib", type=float, default=2.0)
    ap.add_argument("--cycles", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--retained-cycles", type=int, default=3)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.api == "cumem":
        if args.impl not in (None, "staged", "pinned"):
            ap.error("--api cumem: --impl is staged or pinned")
        return child_cumem(args) if args.impl else main_cumem(args)
    if args.impl not in (None, "fabpool", "upstream"):
        ap.error("--impl %s is for --api cumem" % args.impl)
    if args.impl:
        return child(args)
    results, rc = {}, 0
    impls = ["fabpool"] + (["upstream"] if args.tms else [])
    for impl in impls:
        cmd = [sys.executable, os.path.abspath(__file__), "--impl", impl, "--lib", args.lib,
               "--weights-gib", str(args.weights_gib), "--kv-gib", str(args.kv_gib), "--cycles", str(args.cycles), "--rounds", str(args.rounds),
               "--retained-cycles", str(args.retained_cycles)]
        if args.tms:
            cmd += ["--tms", args.tms]
        res, prc, tail = run_child(cmd)
        if res is None:
            print("rl_pause_resume: %s failed (rc %d) before its results: %s" % (impl, prc, tail))
            rc = 1
            continue
        results[impl] = res
        if not results[impl]["bitwise"]:
            rc = 1
        if prc != 0:
            # the original's torch mode fails at interpreter exit (its free hook refuses memory freed outside a
            # region: "only support interesting region"): after its results, so they stand; said, not hidden
            print("rl_pause_resume: %s exited with rc %d after its results (at interpreter exit)" %
                  (impl, prc))
            results[impl]["exit_rc"] = prc
            if impl == "fabpool":
                rc = 1
    if not results:
        return 1
    first = next(iter(results.values()))
    print("rl_pause_resume: %s, torch %s; weights %d tensors, %.2f GiB (CPU backup); KV cache %.2f GiB; %d cycles"
          % (first["gpu"], first["torch"], first["weights"], first["weights_bytes"] / GiB, first["kv_bytes"] / GiB,
             args.cycles))
    have = [i for i in impls if i in results]
    print("%-52s %14s %14s %s" % ("", *(have + [""] * (2 - len(have))), "ratio (fabpool's gain)"))
    print_rows(results, have, ROWS)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return rc


if __name__ == "__main__":
    sys.exit(main())

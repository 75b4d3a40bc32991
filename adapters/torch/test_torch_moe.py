"""A MoE-style dispatch loop on PyTorch, with fabpool as its allocator
(install()), with PyTorch's own, and with PyTorch's own plus a fabpool-backed
torch.cuda.MemPool around the loop (fabpool_torch.mempool(), "mempool"), each
in a subprocess of its own; the results must be bitwise equal.  With fabpool,
free device memory (this process's, held.py: NVML) must come back to its start once
the pool is emptied, and the shim's allocation count must agree with
fabpool's stats.  In the MemPool mode the loop's memory must have come from
fabpool, PyTorch's statistics must keep working, and the memory must go back
to the driver once the MemPool is deleted.

    python3 test_torch_moe.py --lib build/adapters/torch/libfabpool_torch.so [--steps 200]

Without --lib (and FABPOOL_TORCH_LIBRARY) it tests the installed fabpool_torch package.

Each step: a token count that rises and falls (a slow wave plus noise), tokens
made on stream s1, routed to one of E experts (argmax of a gate), permuted by
expert (a stable argsort), then on stream s2 every expert's tokens go through
two bf16 matmuls (SiLU between), and back on s1 the outputs are gathered and
put back in token order.  Streams are ordered with wait_stream only (no
record_stream), as many programs do.  Each step's output is hashed on the host.
Prints one PASS/FAIL line per check and exits 0 only if all pass."""
import argparse
import contextlib
import gc
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import time

HIDDEN, FFN, EXPERTS = 512, 1024, 8
MIB = 1 << 20


def run_one(args):
    """The loop in this process, on one allocator; writes a JSON report to args.out."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")   # deterministic cuBLAS
    report = {"allocator": args.allocator}
    if args.allocator in ("fabpool", "mempool"):
        if args.lib:   # a library of a build tree; without it, the installed package (the wheel)
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
        import fabpool_torch
        if args.allocator == "fabpool":
            report["library"] = fabpool_torch.install(args.lib)   # before any CUDA allocation
        else:
            fabpool_torch.load(args.lib)
            report["library"] = fabpool_torch.library_path(args.lib)
    import torch
    import held   # this process's use of the device (NVML), beside this script
    dev = torch.device("cuda", 0)
    torch.cuda.init()

    def settle():
        gc.collect()
        torch.cuda.synchronize()
        clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
        if clear is not None:
            clear()
        if args.allocator == "fabpool":
            fabpool_torch.empty()
        else:
            torch.cuda.empty_cache()
            if args.allocator == "mempool":
                fabpool_torch.empty()
        torch.cuda.synchronize()
        return held.own_free(0)

    gen = torch.Generator(device=dev)
    gen.manual_seed(20261202)
    W = {}

    def make_weights():
        W["gate"] = (torch.randn(HIDDEN, EXPERTS, generator=gen, device=dev) / math.sqrt(HIDDEN)).to(torch.bfloat16)
        W["w1"] = (torch.randn(EXPERTS, HIDDEN, FFN, generator=gen, device=dev) / math.sqrt(HIDDEN)).to(torch.bfloat16)
        W["w2"] = (torch.randn(EXPERTS, FFN, HIDDEN, generator=gen, device=dev) / math.sqrt(FFN)).to(torch.bfloat16)

    try:
        import numpy  # noqa: F401
        have_numpy = True
    except ImportError:
        have_numpy = False
    pos = None

    def digest(out):
        nonlocal pos
        if have_numpy:
            return hashlib.sha256(out.cpu().view(torch.int16).numpy().tobytes()).hexdigest()
        # without numpy: exact integer sums of the bits, weighted by position, on the device
        v = out.reshape(-1).view(torch.int16).to(torch.int64)
        if pos is None or pos.numel() < v.numel():
            pos = torch.arange(16 * MIB, device=dev, dtype=torch.int64) * 2654435761 % 2147483647 + 1
        return "%d:%d:%d" % (v.numel(), int(v.sum()), int((v * pos[:v.numel()]).sum()))

    s1, s2 = torch.cuda.Stream(device=dev), torch.cuda.Stream(device=dev)

    def step(tokens):
        with torch.cuda.stream(s1):
            x = torch.randn(tokens, HIDDEN, generator=gen, device=dev, dtype=torch.bfloat16)
            expert = torch.argmax(x @ W["gate"], dim=1)
            perm = torch.argsort(expert, stable=True)
            counts = torch.bincount(expert.cpu(), minlength=EXPERTS).tolist()
            xs = x.index_select(0, perm)
        s2.wait_stream(s1)
        outs = []
        with torch.cuda.stream(s2):
            off = 0
            for e, c in enumerate(counts):
                if c:
                    h = torch.nn.functional.silu(xs[off:off + c] @ W["w1"][e])
                    outs.append(h @ W["w2"][e])
                off += c
        s1.wait_stream(s2)
        with torch.cuda.stream(s1):
            ys = torch.cat(outs, dim=0)
            out = torch.empty_like(ys)
            out.index_copy_(0, perm, ys)
            d = digest(out)             # waits for s1
        del x, expert, perm, xs, outs, ys, out
        return d, counts

    # warm-up: loads the kernels and makes cuBLAS's handles (device memory of
    # their own, outside any allocator), then the baseline
    make_weights()
    for t in (300, 2000, 700):
        step(t)
    W.clear()
    free0 = settle()
    mem_pool, scope = None, contextlib.nullcontext()
    if args.allocator == "mempool":
        mem_pool = fabpool_torch.mempool(0, args.lib)
        scope = torch.cuda.use_mem_pool(mem_pool)
    scope.__enter__()
    make_weights()
    # the run
    rng = random.Random(20261202)
    digests, token_counts, min_free = [], [], free0
    t0 = time.time()
    for i in range(args.steps):
        wave = 0.5 + 0.5 * math.sin(i * 2 * math.pi / 60.0)
        tokens = max(64, int(256 + 7000 * wave + rng.randint(-500, 500)))
        d, _ = step(tokens)
        digests.append(d)
        token_counts.append(tokens)
        if i % 10 == 0:
            min_free = min(min_free, held.own_free(0))
    torch.cuda.synchronize()
    report["seconds"] = time.time() - t0
    if args.allocator in ("fabpool", "mempool"):
        report["stats_before_empty"] = fabpool_torch.stats(0)
        report["counters_before_empty"] = fabpool_torch.counters(0)
    if args.allocator != "fabpool":
        # PyTorch's own statistics (with the MemPool they count its tensors too)
        report["torch_max_allocated"] = torch.cuda.max_memory_allocated()
        report["torch_max_reserved"] = torch.cuda.max_memory_reserved()
    W.clear()
    pos = None
    scope.__exit__(None, None, None)
    if mem_pool is not None:
        # the pool's segments go back to fabpool once it is gone and PyTorch empties its cache
        settle()
        del mem_pool, scope
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.synchronize()
    free1 = settle()
    report.update(digests=digests, tokens=token_counts, free0=free0, free1=free1, peak_drop=free0 - min_free,
                  held_source=held.source,
                  hash="sha256" if have_numpy else "integer sums")
    if args.allocator in ("fabpool", "mempool"):
        report["stats_after_empty"] = fabpool_torch.stats(0)
        report["counters"] = fabpool_torch.counters(0)
    with open(args.out, "w") as f:
        json.dump(report, f)
    return 0


def class_allocs(pool):
    return sum(c["allocs"] for c in pool["classes"])


def same_results(args, a, b, name, check):
    same = sum(x == y for x, y in zip(a["digests"], b["digests"]))
    check(len(a["digests"]) == len(b["digests"]) == args.steps and same == args.steps,
          "%s: results bitwise equal to the default allocator's on every step (%d of %d)" % (name, same, args.steps))
    back = b["free0"] - b["free1"]
    check(abs(back) <= args.slack_mib * MIB,
          "%s: free device memory back to its start after empty: %+.1f MiB (peak drop %.1f MiB; by %s)" %
          (name, -back / MIB, b["peak_drop"] / MIB, b.get("held_source")))


def check_fabpool(args, a, b, check):
    """install(): fabpool is PyTorch's allocator."""
    print("fabpool: %.2f s for %d steps (tokens %d to %d), outputs compared by %s" %
          (b["seconds"], args.steps, min(b["tokens"]), max(b["tokens"]), b["hash"]))
    same_results(args, a, b, "fabpool", check)
    c, pool = b["counters"], b["stats_after_empty"]["pool"]
    check(c["allocs"] > 1000 and c["allocs"] == c["reuse_same_stream"] + c["reuse_after_event"] + c["pool_allocs"],
          "allocation count: %d = %d same-stream + %d after an event + %d from the pool" %
          (c["allocs"], c["reuse_same_stream"], c["reuse_after_event"], c["pool_allocs"]))
    check(class_allocs(pool) == c["pool_allocs"],
          "fabpool's stats count the same allocations (%d)" % class_allocs(pool))
    check(pool["blocks"] == c["blocks_live"] + c["cached_blocks"] and pool["in_use_bytes"] ==
          c["usable_bytes_live"] + c["cached_bytes"], "live blocks agree: %d blocks, %d bytes in use" %
          (pool["blocks"], pool["in_use_bytes"]))
    # PyTorch may keep a few blocks of its own (a cuBLASLt workspace): then their slabs stay mapped
    check(c["cached_blocks"] == 0 and (c["blocks_live"] > 0 or pool["mapped_bytes"] == 0),
          "after empty fabpool maps %d bytes, the shim caches %d blocks, PyTorch keeps %d live (%d bytes)" %
          (pool["mapped_bytes"], c["cached_blocks"], c["blocks_live"], c["bytes_live"]))
    check(c["bad_frees"] == 0, "no free refused (%d)" % c["bad_frees"])
    before = b["stats_before_empty"]["pool"]
    print("fabpool before empty: mapped %.1f MiB (peak %.1f), %d chunks mapped all time, driver calls %s" %
          (before["mapped_bytes"] / MIB, before["mapped_bytes_peak"] / MIB, before["chunks_mapped_total"],
           json.dumps(before["driver_calls"])))
    print("shim: %s" % json.dumps(c))


def check_mempool(args, a, b, check):
    """fabpool_torch.mempool(): PyTorch's allocator, a fabpool-backed MemPool around the loop."""
    print("mempool: %.2f s for %d steps" % (b["seconds"], args.steps))
    same_results(args, a, b, "mempool", check)
    mid, c = b["counters_before_empty"], b["counters"]
    check(mid["allocs"] > 0 and mid["bytes_live"] > 0,
          "mempool: the loop's memory came from fabpool (%d segments asked, %.1f MiB live in PyTorch's pool at "
          "the end of the loop)" % (mid["allocs"], mid["bytes_live"] / MIB))
    check(b.get("torch_max_allocated", 0) > 0,
          "mempool: PyTorch's own statistics work (max_memory_allocated %.1f MiB, max_memory_reserved %.1f MiB; "
          "default run: %.1f / %.1f MiB)" % (b.get("torch_max_allocated", 0) / MIB,
                                               b.get("torch_max_reserved", 0) / MIB,
                                               a.get("torch_max_allocated", 0) / MIB,
                                               a.get("torch_max_reserved", 0) / MIB))
    pool = b["stats_after_empty"]["pool"]
    check(c["blocks_live"] == 0 and c["cached_blocks"] == 0 and pool["mapped_bytes"] == 0 and c["bad_frees"] == 0,
          "mempool: once the MemPool is deleted every segment is back (%d live, %d cached, %d bytes mapped, "
          "%d bad frees)" % (c["blocks_live"], c["cached_blocks"], pool["mapped_bytes"], c["bad_frees"]))
    print("mempool shim: %s" % json.dumps(c))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.environ.get("FABPOOL_TORCH_LIBRARY"))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--allocator", choices=["fabpool", "default", "mempool"])
    ap.add_argument("--modes", default="default,fabpool,mempool",
                    help="the runs to compare with the first (default: default,fabpool,mempool)")
    ap.add_argument("--out")
    ap.add_argument("--workdir", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--slack-mib", type=int, default=8)
    args = ap.parse_args()
    if args.allocator:
        return run_one(args)

    results, ok = {}, True

    def check(cond, what):
        nonlocal ok
        ok = ok and bool(cond)
        print(("PASS " if cond else "FAIL ") + what, flush=True)

    modes = args.modes.split(",")
    for name in modes:
        out = os.path.join(args.workdir, "moe-%s.json" % name)
        if os.path.exists(out):
            os.remove(out)
        cmd = [sys.executable, os.path.abspath(__file__), "--allocator", name, "--out", out,
               "--steps", str(args.steps)] + (["--lib", args.lib] if args.lib else [])
        print("running:", " ".join(cmd), flush=True)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
            sys.stdout.write(p.stdout[-3000:])
            sys.stdout.write(p.stderr[-3000:])
            check(p.returncode == 0, "%s run exits 0 (rc %d)" % (name, p.returncode))
        except subprocess.TimeoutExpired as e:
            check(False, "%s run finished within 90 s (%s)" % (name, e))
        if os.path.exists(out):
            with open(out) as f:
                results[name] = json.load(f)
    if len(results) != len(modes) or "default" not in results:
        check(False, "every run wrote its report")
        return 1
    a = results["default"]
    print("default allocator, for reference: %.2f s, %+.1f MiB after empty_cache (peak drop %.1f MiB)" %
          (a["seconds"], -(a["free0"] - a["free1"]) / MIB, a["peak_drop"] / MIB))
    if "fabpool" in results:
        check_fabpool(args, a, results["fabpool"], check)
    if "mempool" in results:
        check_mempool(args, a, results["mempool"], check)
    print("ALL PASS" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""A real-training benchmark of PyTorch's CUDA allocators.

A seeded transformer training loop (default: 8 encoder layers, d_model 1024,
16 heads, vocabulary 32,000, bf16 autocast, AdamW; each step a random sequence
length from 64 to 2,048 with 16,384 tokens, batch = 16384 // length; attention
on PyTorch's flash kernels, --sdpa auto for PyTorch's pick, cuDNN's on the
H200, which builds a plan on the CPU for every new length), run with
PyTorch's default allocator, with expandable_segments and with fabpool
(fabpool_torch.install(stats=True)), each run in its own process, the runs
interleaved, the order rotated each round (A B C, B C A, C A B, ...).  Per run: the median step time over steps
10..end; the peak held by the driver, measured the same way for every
allocator from a side thread of the run (cuMemGetInfo every ~1 ms, and NVML's
per-process used memory through pynvml where it answers), less the baseline
taken after the CUDA context exists and before the first allocation; the peak
of live tensors (requested_bytes.all.peak: the sum of live tensor storages,
which PyTorch's allocator and fabpool's shim both count); driver allocations
per step (memory_stats' num_device_alloc: cudaMalloc or cuMemMap; for fabpool
its chunks mapped); the per-step losses (written to losses-<allocator>-<run>.txt
as float.hex, so runs compare bitwise) and their sum.

    python3 perf/train/train_bench.py --lib build/adapters/torch/libfabpool_torch.so \
        [--runs 3] [--steps 60] [--out-dir DIR]          # the full benchmark
    python3 perf/train/train_bench.py --lib ... --runs 1 --steps 12 --layers 1 --d-model 128 \
        --heads 4 --vocab 1000 --tokens 2048 --max-seq 256   # a quick smoke

Writes DIR/train-bench.json and DIR/train-bench.md (a markdown table) and
prints the table."""
import argparse
import ctypes
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time

MIB = 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
ALLOCATORS = ("default", "expandable", "fabpool")
# more that --allocators may name: fabpool with every stream's frees queued (the owner stream off); fabpool with
# local chunks (handle_type:none: the C++ allocator's pools otherwise have POSIX fd handles, for IPC of tensors)
VARIANTS = {"fabpool-queue": "stream_owner:0", "fabpool-local": "handle_type:none"}


# ------------------------------------------------------------- the instrument

class DriverSampler(threading.Thread):
    """Samples what the driver holds for the device, from its own thread, the
    same way whatever the allocator: cuMemGetInfo (free memory of the device)
    always, and NVML's used memory of this process where pynvml answers."""

    def __init__(self, device, period_s):
        super().__init__(daemon=True)
        self.device, self.period = device, period_s
        self.stop_event = threading.Event()
        self.ready = threading.Event()
        self.cuda = ctypes.CDLL("libcuda.so.1")
        self.base_free = self.min_free = None
        self.samples = 0
        self.error = None
        self.nvml = None
        self.nvml_base = self.nvml_max = None
        self.nvml_note = ""
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(device)
            self.nvml = (pynvml, handle)
            used = self._nvml_used()
            if used is None:
                self.nvml_note = "pynvml lists no memory for this process (PID namespace?)"
                self.nvml = None
        except Exception as e:  # pynvml missing or NVML not usable here
            self.nvml_note = "pynvml: %s" % e
            self.nvml = None

    def _nvml_used(self):
        pynvml, handle = self.nvml
        pid = os.getpid()
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid == pid:
                return p.usedGpuMemory
        return None

    def run(self):
        cu = self.cuda
        try:
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            free, total = ctypes.c_size_t(), ctypes.c_size_t()
            if (cu.cuInit(0) or cu.cuDeviceGet(ctypes.byref(dev), self.device) or
                    cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) or cu.cuCtxSetCurrent(ctx)):
                raise RuntimeError("cannot make the device's primary context current in the sampler")
            first = True
            while True:
                if cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0:
                    if first:
                        self.base_free = self.min_free = free.value
                    self.min_free = min(self.min_free, free.value)
                    self.samples += 1
                if self.nvml is not None:
                    used = self._nvml_used()
                    if used is not None:
                        if first:
                            self.nvml_base = self.nvml_max = used
                        self.nvml_max = max(self.nvml_max, used)
                if first:
                    first = False
                    self.ready.set()
                if self.stop_event.wait(self.period):
                    break
            cu.cuDevicePrimaryCtxRelease(dev)
        except Exception as e:
            self.error = str(e)
        finally:
            self.ready.set()

    def finish(self):
        self.stop_event.set()
        self.join()
        out = {"samples": self.samples, "error": self.error, "nvml_note": self.nvml_note}
        if self.base_free is not None:
            out["held_peak"] = self.base_free - self.min_free
        if self.nvml_base is not None:
            out["nvml_held_peak"] = self.nvml_max - self.nvml_base
        return out


class CSampler:
    """The same instrument (cuMemGetInfo) from a C thread (libfabpool_sampler.so,
    perf/train/sampler.c) that never takes Python's GIL: a Python sampler at
    1 kHz takes the GIL from the training loop, which is bound by Python's
    launch overhead, every millisecond.  No NVML here."""

    def __init__(self, path, device, period_s):
        self.lib = ctypes.CDLL(path)
        self.lib.fabpool_sampler_start.argtypes = [ctypes.c_int, ctypes.c_uint]
        self.lib.fabpool_sampler_stop.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 3
        self.device, self.period_us = device, max(1, int(period_s * 1e6))
        self.ready = threading.Event()
        self.error = None

    def start(self):
        if self.lib.fabpool_sampler_start(self.device, self.period_us) != 0:
            raise RuntimeError("fabpool_sampler_start failed")
        self.ready.set()

    def finish(self):
        base, least, n = ctypes.c_uint64(), ctypes.c_uint64(), ctypes.c_uint64()
        out = {"samples": 0, "error": None, "nvml_note": "", "sampler": "c"}
        if self.lib.fabpool_sampler_stop(ctypes.byref(base), ctypes.byref(least), ctypes.byref(n)) != 0:
            out["error"] = "fabpool_sampler_stop failed"
            return out
        out.update(samples=n.value, held_peak=base.value - least.value)
        if hasattr(self.lib, "fabpool_sampler_cost"):
            tot, mx = ctypes.c_uint64(), ctypes.c_uint64()
            self.lib.fabpool_sampler_cost.argtypes = [ctypes.POINTER(ctypes.c_uint64)] * 2
            if self.lib.fabpool_sampler_cost(ctypes.byref(tot), ctypes.byref(mx)) == 0:
                out.update(sample_cost_us_mean=tot.value / 1e3 / max(1, n.value - 1), sample_cost_us_max=mx.value / 1e3)
        return out


class NoSampler:
    """--sample-ms 0: no instrument (peak held not measured)."""

    def finish(self):
        return {"samples": 0, "error": None, "nvml_note": "", "sampler": "none"}


def profile_summary(prof, step_s):
    """One profiled step: the GPU's busy time (kernels, copies and sets, summed) against the step's wall time,
    the CPU time in the allocator's and the driver's calls, and the top operators by GPU and by CPU time."""
    ev = prof.key_averages()
    # the kernels (device-side events) alone: an operator's self device time counts its kernels a second time
    kernels = [e for e in ev if str(getattr(e, "device_type", "")).endswith("CUDA")]
    gpu_us = sum(e.self_device_time_total for e in kernels)
    out = {"step_ms": step_s * 1e3, "gpu_busy_ms": gpu_us / 1e3}
    names = {}
    for e in prof.events():
        names.setdefault(e.name, [0, 0.0])
        names[e.name][0] += 1
        names[e.name][1] += e.cpu_time_total if hasattr(e, "cpu_time_total") else 0.0
    top_gpu = sorted(ev, key=lambda e: -e.self_device_time_total)[:12]
    top_cpu = sorted(ev, key=lambda e: -e.self_cpu_time_total)[:12]
    out["top_gpu"] = [(e.key, e.count, round(e.self_device_time_total / 1e3, 3)) for e in top_gpu]
    out["top_cpu"] = [(e.key, e.count, round(e.self_cpu_time_total / 1e3, 3)) for e in top_cpu]
    out["cuda_api"] = [(k, v[0], round(v[1] / 1e3, 3)) for k, v in sorted(names.items(), key=lambda kv: -kv[1][1])
                       if k.startswith("cu")][:12]
    return out


def sampler_path(args):
    """The C sampler: --sampler-lib, else libfabpool_sampler.so at the top of the build that made --lib."""
    if args.sampler_lib:
        return args.sampler_lib if args.sampler_lib != "none" else None
    if args.lib:
        p = os.path.join(os.path.dirname(os.path.abspath(args.lib)), "..", "..", "libfabpool_sampler.so")
        if os.path.exists(p):
            return os.path.normpath(p)
    return None


# -------------------------------------------------------------------- one run

def run_one(args):
    """One allocator in this process; writes its JSON report to args.out."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    report = {"allocator": args.allocator, "run": args.run}
    if args.allocator.startswith("fabpool"):
        sys.path.insert(0, os.path.join(ROOT, "adapters", "torch", "python"))
        import fabpool_torch
        report["library"] = fabpool_torch.install(args.lib, stats=True)   # before any CUDA allocation
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dev = torch.device("cuda", 0)
    torch.cuda.init()
    torch.cuda.mem_get_info(0)          # the context exists now; nothing allocated yet
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.sdpa == "flash":
        # PyTorch 2.11 picks cuDNN's attention on the H200, which builds an execution plan on the CPU for every
        # new sequence length: 50-100 ms a step here, more than the GPU's work, and as noisy as the host
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_flash_sdp(True)
    report["sdpa"] = args.sdpa
    cpath = sampler_path(args)
    if args.sample_ms <= 0:
        sampler = NoSampler()           # a diagnosis: is the step time the instrument's?
    elif cpath:
        sampler = CSampler(cpath, 0, args.sample_ms / 1000.0)
        sampler.start()                 # the baseline is taken before it returns
    else:
        # the sampler thread needs the GIL between its samples: hand it over every 1 ms, not every 5
        sys.setswitchinterval(0.001)
        sampler = DriverSampler(0, args.sample_ms / 1000.0)
        sampler.start()
        sampler.ready.wait(10)          # the baseline is the first sample

    torch.manual_seed(args.seed)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(args.vocab, args.d_model)
            layer = nn.TransformerEncoderLayer(args.d_model, args.heads, dim_feedforward=4 * args.d_model,
                                               dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
            self.enc = nn.TransformerEncoder(layer, args.layers, enable_nested_tensor=False)
            self.head = nn.Linear(args.d_model, args.vocab)

        def forward(self, x):
            return self.head(self.enc(self.emb(x)))

    if args.memory_history:
        # PyTorch's history of every allocation and free, no stacks (perf/snapshot_trace.py replays it)
        torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=args.memory_history)
    model = LM().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    rng = random.Random(args.seed)
    gen = torch.Generator(device=dev)
    times, launches, losses, seqs = [], [], [], []
    allocs_at_10 = None
    profile = None
    for step in range(args.steps):
        prof = None
        if step == args.profile_step:
            from torch.profiler import profile as tprofile, ProfilerActivity
            prof = tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
            prof.__enter__()
        seq = rng.randint(args.min_seq, args.max_seq)
        batch = max(1, args.tokens // seq)
        gen.manual_seed(args.seed * 100003 + step)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        data = torch.randint(args.vocab, (batch, seq + 1), generator=gen, device=dev)
        x, y = data[:, :-1], data[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, args.vocab), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        launched = time.perf_counter() - t0   # the CPU's part: every kernel of the step is queued
        value = loss.item()              # waits for the step
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        launches.append(launched)
        if prof is not None:
            prof.__exit__(None, None, None)
            profile = profile_summary(prof, times[-1])
        losses.append(value)
        seqs.append(seq)
        del data, x, y, logits, loss
        if step == 9:
            allocs_at_10 = torch.cuda.memory_stats()["num_device_alloc"]
    torch.cuda.synchronize()
    held = sampler.finish()
    if args.memory_history:
        torch.cuda.memory._dump_snapshot(os.path.join(args.out_dir, "snapshot-%s-%d.pickle" % (args.allocator,
                                                                                             args.run)))
        torch.cuda.memory._record_memory_history(enabled=None)
    # PyTorch's whole allocation path, the allocator's part of every tensor made in the loop: torch.empty + del
    pair_ns = {}
    for nbytes in (4096, 1 << 20, 64 << 20):
        for _ in range(100):
            x = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            del x
        n = 20000
        t = time.perf_counter()
        for _ in range(n):
            x = torch.empty(nbytes, dtype=torch.uint8, device=dev)
            del x
        pair_ns[str(nbytes)] = (time.perf_counter() - t) / n * 1e9
    ms = torch.cuda.memory_stats()
    steady = times[10:] if len(times) > 10 else times
    report.update(
        steps=args.steps, seqs=seqs, step_times=times, median_step_s=statistics.median(steady),
        torch_empty_del_ns=pair_ns, launch_times=launches, median_launch_s=statistics.median(launches[10:] if len(launches) > 10 else launches),
        profile=profile,
        driver=held, requested_peak=ms.get("requested_bytes.all.peak", 0),
        allocated_peak=ms.get("allocated_bytes.all.peak", 0), reserved_peak=ms.get("reserved_bytes.all.peak", 0),
        device_allocs=ms.get("num_device_alloc", 0), device_frees=ms.get("num_device_free", 0),
        device_allocs_steady=(ms.get("num_device_alloc", 0) - allocs_at_10) if allocs_at_10 is not None else None,
        loss_sum=math.fsum(losses), losses_hex=[v.hex() for v in losses])
    if args.allocator.startswith("fabpool"):
        pool = fabpool_torch.stats(0)["pool"]
        report["fabpool"] = {k: pool[k] for k in ("mapped_bytes_peak", "chunks_mapped_total", "chunks_unmapped_total",
                                                  "in_use_bytes_peak")}
        report["fabpool_counters"] = fabpool_torch.counters(0)
    with open(os.path.join(args.out_dir, "losses-%s-%d.txt" % (args.allocator, args.run)), "w") as f:
        for i, v in enumerate(losses):
            f.write("%d %d %s %r\n" % (i, seqs[i], v.hex(), v))
    with open(args.out, "w") as f:
        json.dump(report, f)
    return 0


# --------------------------------------------------------------- the parent

def child_env(allocator):
    env = dict(os.environ)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        env.pop(k, None)
    if allocator in VARIANTS:
        env["FABPOOL_CONF"] = VARIANTS[allocator]
    if allocator == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        env["PYTORCH_ALLOC_CONF"] = "expandable_segments:True"
    return env


def summarize(args, runs):
    by = {a: [r for r in runs if r["allocator"] == a] for a in args.allocators}
    ref = by.get("default", [None])[0] if by.get("default") else None
    summary = {}
    for a, rs in by.items():
        if not rs:
            continue
        meds = [r["median_step_s"] for r in rs]
        held = [r["driver"].get("held_peak") for r in rs if r["driver"].get("held_peak") is not None]
        nvml = [r["driver"].get("nvml_held_peak") for r in rs if r["driver"].get("nvml_held_peak") is not None]
        steady = [r["device_allocs_steady"] / max(1, r["steps"] - 10) for r in rs
                  if r["device_allocs_steady"] is not None]
        s = {
            "runs": len(rs),
            "median_step_ms_per_run": [m * 1e3 for m in meds],
            "median_of_medians_ms": statistics.median(meds) * 1e3,
            "median_launch_ms_per_run": [r["median_launch_s"] * 1e3 for r in rs],
            "spread_ms": (max(meds) - min(meds)) * 1e3,
            "held_peak_mib_per_run": [h / MIB for h in held],
            "held_peak_mib": statistics.median(held) / MIB if held else None,
            "nvml_held_peak_mib": statistics.median(nvml) / MIB if nvml else None,
            "live_peak_mib": statistics.median([r["requested_peak"] for r in rs]) / MIB,
            "allocated_peak_mib": statistics.median([r["allocated_peak"] for r in rs]) / MIB,
            "reserved_peak_mib": statistics.median([r["reserved_peak"] for r in rs]) / MIB,
            "device_allocs_per_step_steady": statistics.median(steady) if steady else None,
            "device_allocs_total": [r["device_allocs"] for r in rs],
            "loss_sums": [r["loss_sum"] for r in rs],
            "losses_equal_default_run0": [ref is not None and r["losses_hex"] == ref["losses_hex"] for r in rs],
        }
        summary[a] = s
    return summary


def run_lines(r, seconds):
    """What the bench prints for one finished run (its JSON report r)."""
    d = r["driver"]
    lines = ["%s run %d: median %.1f ms/step (%.1f ms to queue it), held peak %s MiB, live peak %.0f MiB, "
             "%d driver allocs, loss sum %.6f (%.0f s)" % (
                 r["allocator"], r["run"], r["median_step_s"] * 1e3, r["median_launch_s"] * 1e3,
                 "%.0f" % (d["held_peak"] / MIB) if "held_peak" in d else "n/a",
                 r["requested_peak"] / MIB, r["device_allocs"], r["loss_sum"], seconds)]
    if r.get("torch_empty_del_ns"):
        lines.append("  torch.empty + del: %s" % ", ".join("%s B %.0f ns" % (k, v)
                                                         for k, v in r["torch_empty_del_ns"].items()))
    if "sample_cost_us_mean" in d:
        lines.append("  sampler: %d samples, cuMemGetInfo %.1f us mean, %.1f us at most" % (
            d["samples"], d["sample_cost_us_mean"], d["sample_cost_us_max"]))
    if r.get("profile"):
        pr = r["profile"]
        lines.append("  profiled step: %.1f ms, GPU busy %.1f ms; top GPU %s; top CPU %s" % (
            pr["step_ms"], pr["gpu_busy_ms"], pr["top_gpu"][:4], pr["top_cpu"][:4]))
    return lines


def paired_steps(runs, allocators):
    """Step by step: every run of the bench draws the same sequence lengths, so step i of one allocator compares
    with step i of another.  Per allocator, the median over its runs of each step 10..end, summed: the time of
    the same steps, with the spread from step to step (the lengths) taken out.  None without two runs' worth."""
    by = {}
    for r in runs:
        by.setdefault(r["allocator"], []).append(r["step_times"])
    out = {}
    for a in allocators:
        ts = by.get(a)
        if not ts:
            continue
        n = min(len(t) for t in ts)
        if n <= 10:
            continue
        out[a] = sum(statistics.median(t[i] for t in ts) for i in range(10, n)) * 1e3
    return out or None


def table(summary):
    lines = ["| allocator | step time, median of run medians (per run) | spread | peak held by the driver "
             "(cuMemGetInfo; NVML) | peak live tensors | peak allocated (allocator's blocks) | "
             "allocator's reserved peak | driver allocs/step, steps 10..end | loss sum per run | losses = default "
             "run 1, bitwise |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def f(v, fmt="%.0f MiB"):
        return "n/a" if v is None else fmt % v

    for a, s in summary.items():
        lines.append("| %s | %.1f ms (%s) | %.1f ms | %s; %s | %s | %s | %s | %s | %s | %s |" % (
            a, s["median_of_medians_ms"], ", ".join("%.1f" % m for m in s["median_step_ms_per_run"]),
            s["spread_ms"], f(s["held_peak_mib"]), f(s["nvml_held_peak_mib"]), f(s["live_peak_mib"]),
            f(s["allocated_peak_mib"]), f(s["reserved_peak_mib"]), f(s["device_allocs_per_step_steady"], "%.2f"),
            ", ".join("%.6f" % x for x in s["loss_sums"]),
            ", ".join("yes" if e else "no" for e in s["losses_equal_default_run0"])))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", default=os.environ.get("FABPOOL_TORCH_LIBRARY"))
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--min-seq", type=int, default=64)
    ap.add_argument("--max-seq", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seed", type=int, default=20261203)
    ap.add_argument("--sample-ms", type=float, default=1.0, help="the sampler's period; 0: no sampler (a diagnosis)")
    ap.add_argument("--sdpa", choices=("flash", "auto"), default="flash",
                    help="attention kernels: flash (cuDNN's off: it builds a plan on the CPU for every new sequence "
                         "length) or auto (PyTorch's pick: cuDNN's on the H200)")
    ap.add_argument("--profile-step", type=int, default=-1,
                    help="profile this step with torch.profiler (a diagnosis; its summary goes into the run's JSON)")
    ap.add_argument("--sampler-lib", default=os.environ.get("FABPOOL_SAMPLER_LIBRARY"),
                    help="libfabpool_sampler.so (a C sampling thread); default: beside --lib's build; none: the "
                         "Python thread")
    ap.add_argument("--memory-history", type=int, default=0, metavar="N",
                    help="record PyTorch's memory history (up to N events) over the steps and dump it to "
                         "snapshot-ALLOCATOR-RUN.pickle in --out-dir (perf/snapshot_trace.py makes a trace of it)")
    ap.add_argument("--timeout", type=int, default=0, help="seconds per run (default: 60 + 2 s a step)")
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--allocator", choices=ALLOCATORS + tuple(VARIANTS), help="(internal) one run in this process")
    ap.add_argument("--run", type=int, default=0, help="(internal)")
    ap.add_argument("--out", help="(internal)")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    if args.allocator:
        return run_one(args)
    args.allocators = [a for a in args.allocators.split(",") if a]
    if any(a.startswith("fabpool") for a in args.allocators) and not args.lib:
        ap.error("--lib (or FABPOOL_TORCH_LIBRARY) is needed for the fabpool runs")
    timeout = args.timeout or 60 + 2 * args.steps
    passthrough = ["--steps", str(args.steps), "--tokens", str(args.tokens), "--min-seq", str(args.min_seq),
                   "--max-seq", str(args.max_seq), "--layers", str(args.layers), "--d-model", str(args.d_model),
                   "--heads", str(args.heads), "--vocab", str(args.vocab), "--seed", str(args.seed),
                   "--sample-ms", str(args.sample_ms), "--profile-step", str(args.profile_step), "--sdpa", args.sdpa,
                   "--memory-history", str(args.memory_history),
                   "--out-dir", args.out_dir] + \
                  (["--lib", args.lib] if args.lib else []) + \
                  (["--sampler-lib", sampler_path(args) or "none"])
    runs, failures = [], []
    t_all = time.time()
    for run in range(args.runs):
        # interleaved, the order rotated each round (A B C, B C A, C A B, ...): no allocator always runs in the
        # same place of a round (in two H200 calls the second place was the fastest of the first three)
        k = run % len(args.allocators)
        for a in args.allocators[k:] + args.allocators[:k]:
            out = os.path.join(args.out_dir, "train-%s-%d.json" % (a, run))
            if os.path.exists(out):
                os.remove(out)
            cmd = [sys.executable, os.path.abspath(__file__), "--allocator", a, "--run", str(run), "--out", out] + \
                passthrough
            t0 = time.time()
            try:
                p = subprocess.run(cmd, env=child_env(a), capture_output=True, text=True, timeout=timeout)
                rc, tail = p.returncode, (p.stdout + p.stderr)[-2000:]
            except subprocess.TimeoutExpired:
                rc, tail = "timeout", ""
            if rc != 0 or not os.path.exists(out):
                failures.append("%s run %d: rc %s" % (a, run, rc))
                print("FAILED %s run %d (rc %s):\n%s" % (a, run, rc, tail), flush=True)
                continue
            with open(out) as f:
                r = json.load(f)
            runs.append(r)
            print("\n".join(run_lines(r, time.time() - t0)), flush=True)
    summary = summarize(args, runs)
    md = table(summary)
    instruments = sorted({"cuMemGetInfo from a C thread" if r["driver"].get("sampler") == "c" else
                          "nvml" if "nvml_held_peak" in r["driver"] else "cuMemGetInfo only" for r in runs})
    notes = sorted({r["driver"].get("nvml_note", "") for r in runs} - {""})
    config = {k: getattr(args, k) for k in ("runs", "steps", "tokens", "min_seq", "max_seq", "layers", "d_model",
                                           "heads", "vocab", "seed", "sample_ms", "sdpa")}
    paired = paired_steps(runs, args.allocators)
    result = {"config": config, "summary": summary, "paired_steps_ms": paired, "runs": runs, "failures": failures,
              "instruments": instruments, "notes": notes, "seconds": time.time() - t_all}
    with open(os.path.join(args.out_dir, "train-bench.json"), "w") as f:
        json.dump(result, f, indent=1)
    header = ("Training benchmark: %d layers, d_model %d, %d heads, vocab %d, %d tokens a step (sequence %d..%d), "
              "attention %s, %d steps, %d runs per allocator interleaved (order rotated each round); step time median over steps 10..end; peak held = "
              "device free memory at the start less its minimum, sampled every %.1f ms from a side thread "
              "(instruments: %s)" % (args.layers, args.d_model, args.heads, args.vocab, args.tokens, args.min_seq,
                                    args.max_seq, args.sdpa, args.steps, args.runs, args.sample_ms,
                                    ", ".join(instruments)))
    with open(os.path.join(args.out_dir, "train-bench.md"), "w") as f:
        f.write(header + "\n\n" + md + "\n")
    print(header)
    print(md)
    for n in notes:
        print("note:", n)
    if "fabpool" in summary and "expandable" in summary:
        fb, ex = summary["fabpool"], summary["expandable"]
        print("fabpool / expandable: step time %.3fx, peak held %s, peak held / peak live %s" % (
            fb["median_of_medians_ms"] / ex["median_of_medians_ms"],
            "%.3fx" % (fb["held_peak_mib"] / ex["held_peak_mib"]) if fb["held_peak_mib"] and ex["held_peak_mib"]
            else "n/a",
            "%.3fx" % (fb["held_peak_mib"] / fb["live_peak_mib"]) if fb["held_peak_mib"] and fb["live_peak_mib"]
            else "n/a"))
        if paired and "fabpool" in paired and "expandable" in paired:
            print("fabpool / expandable, step by step (each step's median over the runs, summed over steps "
                  "10..end): %.3fx (%.1f / %.1f ms)" % (paired["fabpool"] / paired["expandable"], paired["fabpool"],
                                                      paired["expandable"]))
    if failures:
        print("FAILED runs:", "; ".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

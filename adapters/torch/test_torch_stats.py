"""torch.cuda's memory statistics with fabpool installed (install(stats=True)),
against what the test knows: the sum of the live tensor storages it made, and
what the driver holds for this process (held.py: NVML, else torch.cuda.mem_get_info).  Needs PyTorch and a GPU.

    python3 test_torch_stats.py --lib build/adapters/torch/libfabpool_torch.so [--out stats.json]

Without --lib (and FABPOOL_TORCH_LIBRARY) it tests the installed fabpool_torch package.

Prints one PASS/FAIL line per check, then ALL PASS or SOME FAILED (exit 0 only
if all pass)."""
import argparse
import gc
import json
import os
import random
import sys

MIB = 1 << 20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.environ.get("FABPOOL_TORCH_LIBRARY"))
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.lib:   # a library of a build tree; without it, the installed package (the wheel)
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
    import fabpool_torch
    fabpool_torch.install(args.lib, stats=True)   # before any CUDA allocation
    import torch
    import held   # this process's use of the device (NVML), beside this script

    ok = True
    report = {}

    def check(cond, what):
        nonlocal ok
        ok = ok and bool(cond)
        print(("PASS " if cond else "FAIL ") + what, flush=True)

    dev = torch.device("cuda", 0)
    torch.cuda.init()   # memory_stats answers {} before CUDA is initialized
    # what PyTorch itself answers with a pluggable allocator, for the record
    fabpool_torch.unpatch_torch_stats()
    try:
        torch.cuda.memory_stats(0)
        report["pytorch_memory_stats"] = "no error"
    except RuntimeError as e:
        report["pytorch_memory_stats"] = str(e).splitlines()[0]
    fabpool_torch.patch_torch_stats(torch)
    print("PyTorch's own memory_stats with the pluggable allocator:", report["pytorch_memory_stats"])

    # warm-up: cuBLAS's workspace and handles come through the allocator too
    a = torch.randn(512, 512, device=dev)
    (a @ a).sum().item()
    del a
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_stats()
    base_req, base_alloc = base["requested_bytes.all.current"], torch.cuda.memory_allocated()
    check(torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated(), "after reset, peak == current")

    rng = random.Random(7)
    live, live_sum, peak_sum, n_made = [], 0, 0, 0
    for step in range(400):
        if live and rng.random() < 0.45:
            t = live.pop(rng.randrange(len(live)))
            live_sum -= t.untyped_storage().nbytes()
            del t
        else:
            n = rng.choice([rng.randint(1, 4096), rng.randint(4096, 1 << 20), rng.randint(1 << 20, 64 << 20)])
            t = torch.empty(n, dtype=torch.uint8, device=dev)
            t.fill_(step % 251)   # no temporaries
            live.append(t)
            live_sum += t.untyped_storage().nbytes()
            n_made += 1
        peak_sum = max(peak_sum, live_sum)
        if step % 50 == 49:
            s = torch.cuda.memory_stats()
            if s["requested_bytes.all.current"] - base_req != live_sum:
                check(False, "step %d: requested_bytes %d, live storages %d" %
                      (step, s["requested_bytes.all.current"] - base_req, live_sum))
    torch.cuda.synchronize()
    s = torch.cuda.memory_stats()
    req = s["requested_bytes.all.current"] - base_req
    alloc = torch.cuda.memory_allocated() - base_alloc
    peak_req = s["requested_bytes.all.peak"] - base_req
    peak_alloc = torch.cuda.max_memory_allocated() - base_alloc
    report.update(tensors_made=n_made, live_tensors=len(live), live_sum=live_sum, peak_sum=peak_sum,
                  requested=req, allocated=alloc, peak_requested=peak_req, peak_allocated=peak_alloc)
    print("live %d tensors, %.1f MiB in storages; allocated %.1f MiB (%.3fx); peak storages %.1f MiB, "
          "max_memory_allocated %.1f MiB (%.3fx)" % (len(live), live_sum / MIB, alloc / MIB, alloc / max(live_sum, 1),
                                                     peak_sum / MIB, peak_alloc / MIB, peak_alloc / max(peak_sum, 1)))
    check(req == live_sum, "requested_bytes.all.current = the sum of live storages (%d)" % live_sum)
    check(peak_req == peak_sum, "requested_bytes.all.peak = the peak of that sum (%d, got %d)" % (peak_sum, peak_req))
    check(live_sum <= alloc <= 1.5 * live_sum + 4096 * len(live),
          "memory_allocated() between the storages and 1.5x (%.3fx)" % (alloc / max(live_sum, 1)))
    check(peak_sum <= peak_alloc <= 1.5 * peak_sum + 4096 * n_made,
          "max_memory_allocated() between the peak of the storages and 1.5x (%.3fx)" %
          (peak_alloc / max(peak_sum, 1)))
    pool = fabpool_torch.stats(0)["pool"]
    check(torch.cuda.memory_reserved() == pool["mapped_bytes"], "memory_reserved() = fabpool's mapped bytes")
    check(torch.cuda.max_memory_reserved() >= torch.cuda.memory_reserved() >= alloc,
          "max_memory_reserved() >= memory_reserved() >= memory_allocated()")
    summary = torch.cuda.memory_summary()
    check("Allocated memory" in summary and "Requested memory" in summary, "torch.cuda.memory_summary() works")
    if hasattr(torch, "accelerator") and hasattr(torch.accelerator, "memory_allocated"):
        check(torch.accelerator.memory_allocated() == torch.cuda.memory_allocated(),
              "torch.accelerator.memory_allocated() answers the same")

    # the driver's view: what fabpool maps is what leaves the device's free memory
    free_live = held.own_free(0)
    reserved_live = torch.cuda.memory_reserved()
    t = None    # the loop's last tensor, if it made one, is still named by t
    live.clear()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()    # patched: fabpool_torch.empty()
    free_empty = held.own_free(0)
    reserved_empty = torch.cuda.memory_reserved()
    report.update(reserved_live=reserved_live, reserved_empty=reserved_empty,
                  free_gain=free_empty - free_live)
    check(torch.cuda.memory_allocated() == base_alloc, "all freed: memory_allocated() back to its base")
    check(reserved_empty < reserved_live, "empty_cache() returned memory (reserved %.1f -> %.1f MiB)" %
          (reserved_live / MIB, reserved_empty / MIB))
    check(abs((free_empty - free_live) - (reserved_live - reserved_empty)) <= 8 * MIB,
          "the device's free memory rose by what reserved fell (%.1f vs %.1f MiB)" %
          ((free_empty - free_live) / MIB, (reserved_live - reserved_empty) / MIB))
    torch.cuda.reset_peak_memory_stats()
    check(torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated() and
          torch.cuda.max_memory_reserved() == torch.cuda.memory_reserved(), "reset_peak_memory_stats()")

    # IPC of a tensor through torch.multiprocessing's path, for the record
    t = torch.ones(1024, device=dev)
    try:
        t.untyped_storage()._share_cuda_()
        report["share_cuda"] = "no error"
    except RuntimeError as e:
        report["share_cuda"] = str(e).splitlines()[0]
    print("sharing a CUDA storage (torch.multiprocessing's path):", report["share_cuda"])
    del t
    report["ok"] = ok
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print("ALL PASS" if ok else "SOME FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""regrow.py --label L --json OUT.json - HybridEP's regrowth in DeepEP itself,
at world size 1: a HybridEPBuffer (hidden 7168, 8 local experts, bf16, made
for 1,024 tokens per rank) whose update_template_config(num_of_tokens_per_rank
=T) is called for T = 1,024 .. 16,384 in steps of 1,024, --reps times, each
time with a fresh buffer.  For every call: its wall time and the device
memory held (the drop of cuMemGetInfo's free bytes since before the buffer,
PyTorch's cache emptied), beside the live set: every buffer HybridEP makes
with its allocator at that size, each rounded up to 2 MiB.  After each
repetition the buffer is deleted and the held bytes must be back to 0.
$FABPOOL_HYBRIDEP_TIMING (set by deepep-run.sh, written by the fabpool
build's update_buffer) gives each regrow's breakdown: map, export, import,
unmap, handle all-gather.  --calls N then times N calls that do not grow
(update_template_config at --first tokens on a fresh buffer): what every
dispatch pays, and with FABPOOL_HYBRIDEP_AGREE=1 the agreement's all-reduce
on top.  Run from the copy's tests/ (for utils.init_dist)."""
import argparse
import gc
import json
import os
import statistics
import sys
import time

MiB = 1 << 20


def round2m(x):
    return 0 if x <= 0 else (x + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)


def live_set(T, cfg, hidden, experts, ranks=1, nodes=1):
    """HybridEP's buffers of its allocator at T tokens per rank (intranode.cu, use_shared_buffer, allgather.cu)."""
    M = T * ranks * nodes
    cd = -(-T // cfg.num_of_tokens_per_chunk_dispatch_api)
    cc = -(-T // cfg.num_of_tokens_per_chunk_combine_api)
    sizes = {
        "expert_input_token": M * hidden * 2,
        "expert_input_prob": M * experts * ranks * 4,
        "expert_output_scaling_factor": M * (hidden // 128) * 4,
        "dispatch_chunk_flags": cd * ranks * nodes * 4,
        "combine_chunk_flags": cc * ranks * nodes * 4,
        "dispatch_completion_flags": 8,
        "combine_completion_flags": 8,
        "allgather_dst": experts * ranks * nodes * T * ranks * nodes,
        "allgather_flag": 8,
    }
    return sizes, sum(round2m(s) for s in sizes.values())


def held(free0):
    import torch
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return free0 - torch.cuda.mem_get_info()[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=1, help="ranks, one GPU each (torch.multiprocessing.spawn)")
    ap.add_argument("--label", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--first", type=int, default=1024)
    ap.add_argument("--last", type=int, default=16384)
    ap.add_argument("--step", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=0, help="then time this many calls that do not grow")
    a = ap.parse_args()
    if a.world > 1:
        import torch.multiprocessing
        torch.multiprocessing.spawn(run, args=(a,), nprocs=a.world)
        return 0
    return run(0, a)


def run(local_rank, a):
    import torch
    import torch.distributed as dist
    from utils import init_dist
    import deep_ep

    hidden, experts, R = 7168, 8, a.world
    _, _, group = init_dist(local_rank, a.world)
    dist.barrier()  # NCCL's communicator and its buffers exist before the baseline
    x = torch.ones(8, dtype=torch.uint8, device="cuda")
    out = [torch.empty_like(x)]
    dist.all_gather(out, x, group)
    del x, out
    timing = os.environ.get("FABPOOL_HYBRIDEP_TIMING")
    if timing and a.world > 1:
        timing += ".rank%d" % local_rank  # one file per rank
        os.environ["FABPOOL_HYBRIDEP_TIMING"] = timing  # (read by update_buffer in C++)
    if timing and os.path.exists(timing):
        os.remove(timing)
    gc.collect()
    torch.cuda.empty_cache()
    free0 = torch.cuda.mem_get_info()[0]
    rows, ends, times, worst_over = [], [], [], None
    for rep in range(a.reps):
        buf = deep_ep.HybridEPBuffer(group=group, hidden_dim=hidden, max_num_of_tokens_per_rank=a.first,
                                     num_local_experts=experts, use_fp8=False)
        for T in range(a.first, a.last + 1, a.step):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            cfg = buf.update_template_config(num_of_tokens_per_rank=T)
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) * 1e6
            sizes, live = live_set(T, cfg, hidden, experts, ranks=R)
            h = held(free0)
            if T > a.first:
                times.append(dt)
            over = h - live
            worst_over = over if worst_over is None else max(worst_over, over)
            rows.append({"rep": rep, "tokens": T, "us": round(dt, 1), "held": h, "live_rounded": live,
                         "over_live": over})
        del buf, cfg
        gc.collect()
        ends.append(held(free0))
    calls = []
    if a.calls:
        buf = deep_ep.HybridEPBuffer(group=group, hidden_dim=hidden, max_num_of_tokens_per_rank=a.first,
                                     num_local_experts=experts, use_fp8=False)
        for i in range(a.calls):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            buf.update_template_config(num_of_tokens_per_rank=a.first)
            torch.cuda.synchronize()
            calls.append((time.perf_counter() - t0) * 1e6)
        del buf
        gc.collect()
    br = {}
    if timing and os.path.exists(timing):
        recs = []
        with open(timing) as f:
            for line in f:
                p = line.split()
                d = {"path": p[0]}
                for kv in p[1:]:
                    k, v = kv.split("=")
                    try:
                        d[k] = float(v)
                    except ValueError:
                        d[k] = v
                recs.append(d)
        if recs:
            br["path"] = sorted({r["path"] for r in recs})
            br["handle"] = sorted({r.get("handle", "?") for r in recs})
            for k in ("total_us", "map_us", "export_us", "import_us", "unmap_us", "gather_us", "gathered_bytes",
                      "exports", "full_reexports", "compactions", "reuses"):
                br[k + "_median"] = statistics.median(r[k] for r in recs)
            br["regrows_logged"] = len(recs)
    res = {
        "label": a.label,
        "regrows": len(times),
        "regrow_us_median": round(statistics.median(times), 1) if times else None,
        "regrow_us_min": round(min(times), 1) if times else None,
        "regrow_us_max": round(max(times), 1) if times else None,
        "held_over_live_max_MiB": round(worst_over / MiB, 2) if worst_over is not None else None,
        "held_at_last_MiB": round(rows[-1]["held"] / MiB, 1) if rows else None,
        "live_at_last_MiB": round(rows[-1]["live_rounded"] / MiB, 1) if rows else None,
        "held_after_delete_MiB": [round(e / MiB, 2) for e in ends],
        "breakdown": br,
        "rows": rows,
    }
    res["world"] = a.world
    res["agree"] = os.environ.get("FABPOOL_HYBRIDEP_AGREE", "0")
    if calls:
        calls.sort()
        res["calls"] = len(calls)
        res["call_us_median"] = round(statistics.median(calls), 2)
        res["call_us_p99"] = round(calls[min(len(calls) - 1, len(calls) * 99 // 100)], 2)
        print(f"CALLS {a.label} (rank {local_rank} of {a.world}, FABPOOL_HYBRIDEP_AGREE={res['agree']}): "
              f"{len(calls)} calls of update_template_config that do not grow: median {res['call_us_median']} us, "
              f"p99 {res['call_us_p99']} us", flush=True)
    if local_rank == 0:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(f"REGROW {a.label} (rank {local_rank} of {a.world}): {res['regrows']} regrows, median {res['regrow_us_median']} us "
          f"(min {res['regrow_us_min']}, max {res['regrow_us_max']}); held at 16k tokens {res['held_at_last_MiB']} "
          f"MiB vs live set {res['live_at_last_MiB']} MiB (held - live at most {res['held_over_live_max_MiB']} MiB); "
          f"after delete {res['held_after_delete_MiB']} MiB; breakdown {json.dumps(br)}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

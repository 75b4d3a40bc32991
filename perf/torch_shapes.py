"""Peak device memory held over peak bytes live, through PyTorch, for allocation
shapes of changing sizes: fabpool (fabpool_torch.install()), PyTorch's default
caching allocator, its expandable segments and its cudaMallocAsync backend,
each shape and allocator in a subprocess of its own, the same sizes (the same
seed) for all.  The instrument is the same for every allocator: the device's
used memory (cudaMemGetInfo) after every allocation and free, less what was
used before the first one.

    python3 perf/torch_shapes.py --lib build/adapters/torch/libfabpool_torch.so \\
        [--shapes activations,loguniform,...] [--allocators fabpool,default,...] \\
        [--seeds 1] [--json out.json]

Shapes (the parameters of each are in SHAPES below):
  activations   a transformer-like step: layers that each allocate a few
                activations proportional to a sequence length drawn each step,
                freed in reverse at the step's end
  loguniform    sizes log-uniform between two bounds, a live set of up to a
                cap, random frees
  uniform       RMM-style: sizes uniform 1 B..64 KiB, a live set of up to a cap
  normal        RMM-style: sizes normal around 1 MiB, up to 4 MiB
  dispatch      expert-parallel dispatch: per step, each expert's buffer sized
                by its share of a token count (tokens x hidden x 2 bytes), a
                combine buffer, freed first in first out; some tensors live
                on into the next step
  Shapes ending in "2" are the same shapes on other parameters (sizes,
  counts, lengths), to show that a bound is the layout's, not one setting's.

Prints a table of the ratios and, per shape, whether fabpool's ratio is at
most the best of PyTorch's allocators in the same run plus 0.02; exits 0 if
every shape that ran passes, 1 if one does not, 2 for a wrong command line."""
import argparse
import json
import math
import os
import random
import subprocess
import sys

KIB, MIB = 1 << 10, 1 << 20

SHAPES = {
    "activations": dict(kind="activations", steps=40, layers=24, per_layer=(2, 4, 8, 16), seq=(1024, 8192),
                        unit=1024),
    "activations2": dict(kind="activations", steps=40, layers=12, per_layer=(3, 6, 1, 12, 24), seq=(300, 5000),
                         unit=1536),
    "loguniform": dict(kind="random", ops=20000, lo=4 * KIB, hi=16 * MIB, live=1500, dist="log"),
    "loguniform2": dict(kind="random", ops=12000, lo=64 * KIB, hi=64 * MIB, live=300, dist="log"),
    "uniform": dict(kind="random", ops=20000, lo=1, hi=64 * KIB, live=4000, dist="uniform"),
    "normal": dict(kind="random", ops=20000, lo=1, hi=4 * MIB, live=600, dist="normal"),
    "dispatch": dict(kind="dispatch", steps=120, experts=16, tokens=(2048, 16384), hidden=7168, keep=0.2),
    "dispatch2": dict(kind="dispatch", steps=120, experts=8, tokens=(512, 24576), hidden=4096, keep=0.5),
}

ALLOCATORS = {
    "fabpool": {},
    "default": {"PYTORCH_CUDA_ALLOC_CONF": ""},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "cudaMallocAsync": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
}


def size_of(rng, p):
    lo, hi = p["lo"], p["hi"]
    if p["dist"] == "log":
        return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    if p["dist"] == "uniform":
        return rng.randint(lo, hi)
    return max(lo, min(hi, int(rng.gauss(1 * MIB, 0.75 * MIB))))


def program(name, seed):
    """The shape as a list of operations: ("a", id, bytes) or ("f", id)."""
    p = SHAPES[name]
    rng = random.Random(seed * 7919 + sum(map(ord, name)))
    ops, nid = [], 0
    if p["kind"] == "activations":
        for _ in range(p["steps"]):
            seq = rng.randint(*p["seq"])
            ids = []
            for _ in range(p["layers"]):
                for f in p["per_layer"]:
                    ops.append(("a", nid, seq * p["unit"] * f))
                    ids.append(nid)
                    nid += 1
            ops.extend(("f", i) for i in reversed(ids))
    elif p["kind"] == "random":
        live = []
        for _ in range(p["ops"]):
            # a live set that climbs to its cap, then stays about there
            if live and (len(live) >= p["live"] or rng.random() < 0.4):
                ops.append(("f", live.pop(rng.randrange(len(live)))))
            else:
                ops.append(("a", nid, size_of(rng, p)))
                live.append(nid)
                nid += 1
        ops.extend(("f", i) for i in live)
    else:
        kept = []
        for _ in range(p["steps"]):
            tokens = rng.randint(*p["tokens"])
            w = [rng.gammavariate(0.5, 1.0) for _ in range(p["experts"])]
            total = sum(w) or 1.0
            ids = []
            for e in range(p["experts"]):
                n = max(1, int(tokens * w[e] / total))
                ops.append(("a", nid, n * p["hidden"] * 2))
                ids.append(nid)
                nid += 1
            ops.append(("a", nid, tokens * p["hidden"] * 2))   # the combine buffer
            ids.append(nid)
            nid += 1
            ops.extend(("f", i) for i in kept)
            kept = [i for i in ids if rng.random() < p["keep"]]
            ops.extend(("f", i) for i in ids if i not in kept)
        ops.extend(("f", i) for i in kept)
    return ops


def child(args):
    """One shape on one allocator in this process: prints one JSON line."""
    if args.allocator == "fabpool":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "adapters", "torch",
                                        "python"))
        import fabpool_torch
        fabpool_torch.install(args.lib)
    import torch
    torch.cuda.init()
    torch.cuda.synchronize()

    def used():
        free, total = torch.cuda.mem_get_info()
        return total - free

    base = used()
    live = held = peak_live = peak_held = 0
    tensors = {}
    for op in program(args.shape, args.seed):
        if op[0] == "a":
            tensors[op[1]] = torch.empty(op[2], dtype=torch.uint8, device="cuda")
            live += op[2]
            peak_live = max(peak_live, live)
        else:
            live -= tensors.pop(op[1]).numel()
        held = used() - base
        peak_held = max(peak_held, held)
    print(json.dumps({"shape": args.shape, "allocator": args.allocator, "seed": args.seed, "peak_live": peak_live,
                      "peak_held": peak_held, "ratio": peak_held / peak_live if peak_live else 0.0,
                      "installed": fabpool_torch.installed() if args.allocator == "fabpool" else None}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lib", help="libfabpool_torch.so (for the fabpool runs)")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--allocators", default=",".join(ALLOCATORS))
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--json", help="every run's figures into this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    ap.add_argument("--allocator", help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    shapes, allocs = args.shapes.split(","), args.allocators.split(",")
    bad = [s for s in shapes if s not in SHAPES] + [a for a in allocs if a not in ALLOCATORS]
    if bad:
        ap.error("unknown shape or allocator: %s" % ", ".join(bad))
    runs = []
    for seed in range(1, args.seeds + 1):
        for s in shapes:
            for a in allocs:
                env = dict(os.environ)
                env.update(ALLOCATORS[a])
                if not env.get("PYTORCH_CUDA_ALLOC_CONF"):
                    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
                cmd = [sys.executable, os.path.abspath(__file__), "--child", "--shape", s, "--allocator", a,
                       "--seed", str(seed)] + (["--lib", args.lib] if args.lib else [])
                r = subprocess.run(cmd, env=env, capture_output=True, text=True)
                line = r.stdout.strip().splitlines()[-1:] if r.returncode == 0 else []
                run = json.loads(line[0]) if line else {"shape": s, "allocator": a, "seed": seed,
                                                        "error": (r.stderr or r.stdout)[-600:]}
                runs.append(run)
                print("%-13s %-16s seed %d: %s" % (s, a, seed, "ratio %.3f (peak held %.1f MiB, live %.1f MiB)%s" % (
                    run["ratio"], run["peak_held"] / MIB, run["peak_live"] / MIB,
                    " [%s]" % run["installed"] if run.get("installed") else "") if "ratio" in run else
                    "FAILED: " + run["error"].strip().splitlines()[-1] if run["error"].strip() else "FAILED"),
                      flush=True)
    ok = True
    print("\n%-13s" % "shape" + "".join("%17s" % a for a in allocs) + "   verdict")
    for s in shapes:
        mean = {}
        for a in allocs:
            xs = [r["ratio"] for r in runs if r["shape"] == s and r["allocator"] == a and "ratio" in r]
            mean[a] = sum(xs) / len(xs) if xs else None
        others = [v for a, v in mean.items() if a != "fabpool" and v is not None]
        verdict = "-"
        if "fabpool" in mean and others:
            good = mean["fabpool"] is not None and mean["fabpool"] <= min(others) + 0.02
            ok = ok and good
            verdict = "PASS" if good else "FAIL"
        print("%-13s" % s + "".join("%17s" % ("%.3f" % v if v is not None else "-") for v in mean.values()) +
              "   " + verdict + (" (best of PyTorch's %.3f, + 0.02)" % min(others) if others else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "shapes": {s: SHAPES[s] for s in shapes}}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

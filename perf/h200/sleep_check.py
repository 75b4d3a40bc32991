"""Sleep and wake of PyTorch memory on one GPU through fabpool tags.

A small transformer (about 170 M parameters) is trained with AdamW in a
torch.cuda.MemPool of the tag "weights" (parameters, gradients, optimizer
state, activations), beside a KV-cache-like tensor in the tag "kv".  Then:
  1. sleep: weights offloaded, kv discarded; this process's use of the
     device (adapters/torch/held.py: NVML) shows what the driver got back,
     against what the two pools mapped;
  2. wake: every parameter and optimizer state reads back bitwise at the same
     data_ptr; kv is reported as discarded;
  3. training goes on; its losses are compared with a run that never slept
     (same seed), and with a second never-slept run (the run-to-run spread);
  4. 10 GiB in the tag "big": sleep + wake time against torch's pinned
     device-to-host and host-to-device copy bandwidth measured here (torch's
     pinned memory is cudaHostAlloc: the alternative to fabpool's VMM host
     memory), and the time to allocate that much pinned memory either way.
One PASS/FAIL line per criterion; results also in --out (JSON).
Usage: sleep_check.py [--lib build/adapters/torch/libfabpool_torch.so] --out OUT/sleep.json (without --lib: the
installed fabpool_torch package)"""
import argparse
import json
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS, before torch loads

ap = argparse.ArgumentParser()
ap.add_argument("--lib", help="a build tree's libfabpool_torch.so (default: the installed fabpool_torch package)")
ap.add_argument("--out", default="sleep.json")
ap.add_argument("--steps1", type=int, default=6)
ap.add_argument("--steps2", type=int, default=6)
ap.add_argument("--big-gib", type=int, default=10)
ap.add_argument("--keep-host", type=int, default=1,
                help="1: the tags' pools keep their host copies from one wake to the next sleep (sleep_keep_host), "
                     "and the 10 GiB part sleeps twice: the second sleep reuses them")
args = ap.parse_args()
if args.keep_host:
    os.environ["FABPOOL_CONF"] = ",".join(x for x in (os.environ.get("FABPOOL_CONF", ""), "sleep_keep_host:1") if x)
if args.lib:
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.lib)))
import fabpool_torch  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "adapters", "torch"))
import held  # noqa: E402  this process's use of the device (NVML), so that other processes on the GPU do not count

torch.use_deterministic_algorithms(True, warn_only=True)
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = False
fabpool_torch.load(args.lib)
GiB = 1 << 30
results = {}
verdicts = []


def verdict(name, ok, detail):
    line = "%s %s: %s" % ("PASS" if ok else "FAIL", name, detail)
    print(line, flush=True)
    verdicts.append(line)
    results[name] = {"pass": bool(ok), "detail": detail}


class Model(nn.Module):
    def __init__(self, vocab=8192, d=1024, layers=12, heads=16, ff=4096):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
        self.body = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(self.body(self.emb(x)))


def batch(step):
    g = torch.Generator(device="cuda").manual_seed(1000 + step)
    x = torch.randint(0, 8192, (8, 256), device="cuda", generator=g)
    return x, torch.roll(x, -1, dims=1)


def make():
    torch.manual_seed(0)
    m = Model().cuda()
    return m, torch.optim.AdamW(m.parameters(), lr=1e-4)


def train(m, opt, first, n):
    losses = []
    for s in range(first, first + n):
        x, y = batch(s)
        loss = nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def state_tensors(m, opt):
    ts = [p for p in m.parameters()]
    for st in opt.state.values():
        ts += [v for v in st.values() if torch.is_tensor(v) and v.is_cuda]
    return ts


# ---------------------------------------------------------------- never slept, twice (PyTorch's allocator)
n_all = args.steps1 + args.steps2
m, opt = make()
ref_a = train(m, opt, 0, n_all)
del m, opt
m, opt = make()
ref_c = train(m, opt, 0, n_all)
del m, opt
torch.cuda.synchronize()
torch.cuda.empty_cache()

# ---------------------------------------------------------------- trained in the tag "weights", slept, woken
weights = fabpool_torch.mempool(tag="weights")
kv = fabpool_torch.mempool(tag="kv")
with torch.cuda.use_mem_pool(weights):
    m, opt = make()
    losses_b = train(m, opt, 0, args.steps1)
with torch.cuda.use_mem_pool(kv):
    cache = torch.randn(256 << 20, device="cuda")  # 1 GiB of "KV cache"
n_params = sum(p.numel() for p in m.parameters())
tensors = state_tensors(m, opt)
ptrs = [t.data_ptr() for t in tensors]
torch.cuda.synchronize()
snap = [t.detach().cpu().clone() for t in tensors]
state_bytes = sum(t.numel() * t.element_size() for t in tensors)
print("model: %.1f M parameters; parameters + AdamW state %.2f GiB in %d tensors" %
      (n_params / 1e6, state_bytes / GiB, len(tensors)), flush=True)

held_b = fabpool_torch.tag_stats("weights")["mapped_bytes"] + fabpool_torch.tag_stats("kv")["mapped_bytes"]
torch.cuda.synchronize()
free0 = held.own_free(0)
t0 = time.perf_counter()
slept = fabpool_torch.sleep(tags=["weights", "kv"], offload={"weights"})
t_sleep = time.perf_counter() - t0
free1 = held.own_free(0)
back = free1 - free0
results["sleep"] = {"held_bytes": held_b, "given_back_bytes": back, "seconds": t_sleep, "state": slept}
verdict("memory_given_back", held_b > 0 and back >= 0.95 * held_b,
        "the two tags mapped %.3f GiB; %.3f GiB more free after the sleep (%.4f of it; by %s), "
        "host copies %.3f GiB, sleep %.3f s" % (held_b / GiB, back / GiB, back / held_b if held_b else 0, held.source,
                                                slept["weights"]["host_bytes"] / GiB, t_sleep))
t0 = time.perf_counter()
woke = fabpool_torch.wake(tags=["weights", "kv"])
t_wake = time.perf_counter() - t0
same_ptr = [t.data_ptr() for t in tensors] == ptrs
equal = all(torch.equal(t.detach().cpu().view(torch.uint8), s.view(torch.uint8)) for t, s in zip(tensors, snap))
verdict("restored_bitwise", same_ptr and equal,
        "%d parameter and optimizer tensors (%.2f GiB): same data_ptr %s, bitwise equal %s; wake %.3f s" %
        (len(tensors), state_bytes / GiB, same_ptr, equal, t_wake))
kvs = fabpool_torch.sleep_state("kv")
verdict("discarded_reported", kvs["mode"] == "discard" and kvs["discarded_bytes"] > 0 and
        kvs["offloaded_bytes"] == 0 and not kvs["asleep"],
        "tag kv: mode %s, %.3f GiB discarded, %d offloaded (its contents are undefined after wake)" %
        (kvs["mode"], kvs["discarded_bytes"] / GiB, kvs["offloaded_bytes"]))
with torch.cuda.use_mem_pool(weights):
    losses_b += train(m, opt, args.steps1, args.steps2)
spread = max(abs(a - c) for a, c in zip(ref_a, ref_c))
diff = max(abs(a - b) for a, b in zip(ref_a, losses_b))
print("losses never slept (A):  %s" % ref_a)
print("losses slept at step %d: %s" % (args.steps1, losses_b))
print("losses never slept (C):  %s" % ref_c)
results["losses"] = {"never_slept_a": ref_a, "slept": losses_b, "never_slept_c": ref_c, "max_diff_slept": diff,
                     "spread_never_slept": spread}
verdict("losses", losses_b == ref_a or diff <= spread,
        "bitwise equal to the never-slept run: %s; max |slept - A| %.3g, run-to-run spread max |A - C| %.3g" %
        (losses_b == ref_a, diff, spread))
del m, opt, tensors, snap, cache
torch.cuda.synchronize()

# ---------------------------------------------------------------- 10 GiB: sleep + wake against pinned copies
n = args.big_gib
big = fabpool_torch.mempool(tag="big")
with torch.cuda.use_mem_pool(big):
    chunks = [torch.full((GiB // 4,), float(i), device="cuda") for i in range(n)]
torch.cuda.synchronize()
big_ptrs = [c.data_ptr() for c in chunks]
# pinned copies, as torch does them (cudaHostAlloc memory, one 1 GiB buffer per GiB)
t0 = time.perf_counter()
pinned = [torch.empty(GiB // 4, pin_memory=True) for _ in range(n)]
t_pin_alloc = time.perf_counter() - t0
for rep in range(2):  # the first round warms up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for c, h in zip(chunks, pinned):
        h.copy_(c, non_blocking=True)
    torch.cuda.synchronize()
    t_d2h = time.perf_counter() - t0
    t0 = time.perf_counter()
    for c, h in zip(chunks, pinned):
        c.copy_(h, non_blocking=True)
    torch.cuda.synchronize()
    t_h2d = time.perf_counter() - t0
del pinned
bw_d2h, bw_h2d = n / t_d2h, n / t_h2d


def big_round(plus):
    """Sleep (offload) and wake the tag "big"; its tensors hold i + plus.  (state, sleep s, wake s, data ok)."""
    t0 = time.perf_counter()
    st = fabpool_torch.sleep(tags="big", offload=True)
    t_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fabpool_torch.wake(tags="big")
    t_w = time.perf_counter() - t0
    ok = [c.data_ptr() for c in chunks] == big_ptrs and all(
        c[:: (1 << 20)].eq(float(i) + plus).all().item() for i, c in enumerate(chunks))
    return st["big"], t_s, t_w, ok


s_big, t_bsleep, t_bwake, ok_data = big_round(0.0)
t_copies = t_d2h + t_h2d
results["big"] = {"gib": n, "sleep_s": t_bsleep, "wake_s": t_bwake, "pinned_d2h_s": t_d2h, "pinned_h2d_s": t_h2d,
                  "pinned_d2h_gib_s": bw_d2h, "pinned_h2d_gib_s": bw_h2d, "pinned_alloc_s": t_pin_alloc,
                  "offloaded_bytes": s_big["offloaded_bytes"], "data_ok": ok_data}
print("10 GiB: sleep %.3f s (%.1f GiB/s), wake %.3f s (%.1f GiB/s); pinned copies in the same run: D2H %.3f s "
      "(%.1f GiB/s), H2D %.3f s (%.1f GiB/s); torch pinned allocation of %d GiB %.3f s" %
      (t_bsleep, n / t_bsleep, t_bwake, n / t_bwake, t_d2h, bw_d2h, t_h2d, bw_h2d, n, t_pin_alloc))
# the bar: an offload to pinned memory made at sleep time (vLLM's CuMemAllocator allocates its pinned CPU
# copies in sleep and drops them after wake) costs the pinned allocation plus both copies; sleep + wake must
# stay within 2x that.  Pinning 10 GiB of host pages is most of it either way (torch's cudaHostAlloc above,
# fabpool's cuMemCreate of host NUMA memory); the copies alone are printed as the floor.
t_offload = t_pin_alloc + t_copies
results["big"]["pinned_alloc_and_copies_s"] = t_offload
verdict("sleep_wake_10GiB", ok_data and t_bsleep + t_bwake <= 2 * t_offload,
        "sleep + wake %.3f s against %.3f s for a pinned allocation + D2H + H2D (ratio %.2f, bar 2.0), %.3f s for "
        "the copies alone (ratio %.2f); data back at the same data_ptrs: %s" %
        (t_bsleep + t_bwake, t_offload, (t_bsleep + t_bwake) / t_offload, t_copies, (t_bsleep + t_bwake) / t_copies,
         ok_data))
if args.keep_host:
    # a second round of the same memory: the host copies kept by the first wake are reused (no pinning)
    for c in chunks:
        c.add_(1.0)
    torch.cuda.synchronize()
    s2, t_bsleep2, t_bwake2, ok2 = big_round(1.0)
    reused = s2.get("host_reused_bytes", 0)
    results["big_second"] = {"sleep_s": t_bsleep2, "wake_s": t_bwake2, "host_reused_bytes": reused, "data_ok": ok2}
    print("10 GiB again (sleep_keep_host): sleep %.3f s, wake %.3f s, %.2f GiB of host copies reused" %
          (t_bsleep2, t_bwake2, reused / GiB))
    verdict("sleep_wake_10GiB_again", ok2 and reused > 0 and t_bsleep2 + t_bwake2 <= 2 * t_copies + 0.5,
            "second sleep + wake %.3f s into the kept host memory against %.3f s for the pinned D2H + H2D copies "
            "(ratio %.2f; bar 2x the copies + 0.5 s); reused %d bytes; data back: %s" %
            (t_bsleep2 + t_bwake2, t_copies, (t_bsleep2 + t_bwake2) / t_copies, reused, ok2))
with open(args.out, "w") as f:
    json.dump(results, f, indent=1)
print("SLEEP-CHECK %s" % ("PASS" if all(v.startswith("PASS") for v in verdicts) else "FAIL"))

"""fabpool_memory_saver and fabpool_cumem on PyTorch and a GPU (the real
driver): device memory given back by a pause and taken again by a resume,
bytes restored bitwise, host copies as CPU tensors and retained at one
address, pinned host memory back to its level, a CUDA graph captured into a
tag and replayed after a pause, vLLM's sleep / wake_up with offload and
discard (the offload through the staging ring, host memory back to its level
after the cycles; the library's pinned offload beside it).  Exits 77 (skipped) without torch or a GPU.
Usage: test_rl_gpu.py <directory of libfabpool_torch.so and the modules>"""
import gc
import os
import sys

sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "python"))
try:
    import torch
except ImportError:
    print("test_rl_gpu: no torch here: skipped")
    sys.exit(77)
if not torch.cuda.is_available():
    print("test_rl_gpu: no GPU: skipped")
    sys.exit(77)
import fabpool_cumem  # noqa: E402
import held  # noqa: E402  (beside this script)
import fabpool_memory_saver  # noqa: E402

failures = []
MiB = 1 << 20


def check(cond, what):
    print(("ok: " if cond else "FAILED: ") + what, flush=True)
    if not cond:
        failures.append(what)


def used():
    """What this process uses of the device (NVML where it can say: other processes on the GPU do not move it)."""
    return torch.cuda.get_device_properties(0).total_memory - held.own_free(0)


def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def pattern(n, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda", generator=g)


tms = fabpool_memory_saver.torch_memory_saver
tms.hook_mode = "torch"
dev = "cuda"

# weights with backup (many sizes), a cache without
sizes = [4096, 100_000, 3 * MiB + 5, 64 * MiB, 512 * MiB]
with tms.region(tag="weights", enable_cpu_backup=True):
    weights = [pattern(n, i) for i, n in enumerate(sizes)]
with tms.region(tag="kv_cache"):
    kv = torch.full((1 << 30,), 20, dtype=torch.uint8, device=dev)
expect = [w.cpu() for w in weights]
ptrs = [w.data_ptr() for w in weights] + [kv.data_ptr()]
torch.cuda.synchronize()
# one unmeasured pause and resume first: the first copies load their kernels and the driver's host-copy
# machinery, which takes device memory of this process once (about 70 MiB on an H100) and would hide part of
# what the first measured pause gives back
tms.pause()
tms.resume()
check(all(torch.equal(w.cpu(), e) for w, e in zip(weights, expect)), "warm-up cycle: weights bitwise")
torch.cuda.synchronize()
rss0 = rss()

for cycle in range(3):
    u0 = used()
    tms.pause("kv_cache")
    u1 = used()
    check(u0 - u1 >= 1 << 30, "cycle %d: pause(kv_cache) gives back its GiB (%d MiB)" % (cycle, (u0 - u1) // MiB))
    tms.pause()
    u2 = used()
    check(u1 - u2 >= sum(sizes), "cycle %d: pause() gives back the weights (%d MiB)" % (cycle, (u1 - u2) // MiB))
    b = tms.get_cpu_backup(weights[3])
    check(b is not None and b.device.type == "cpu" and torch.equal(b, expect[3]),
          "cycle %d: get_cpu_backup: the weight's bytes on the CPU" % cycle)
    check(tms.get_cpu_backup(kv) is None, "cycle %d: no backup of the cache" % cycle)
    unrelated = torch.full((256 * MiB,), 30, dtype=torch.uint8, device=dev)   # takes some of the freed memory
    tms.resume()
    check(used() - u2 >= sum(sizes) + (1 << 30), "cycle %d: resume maps both again" % cycle)
    check(all(torch.equal(w.cpu(), e) for w, e in zip(weights, expect)), "cycle %d: weights bitwise" % cycle)
    check([w.data_ptr() for w in weights] + [kv.data_ptr()] == ptrs, "cycle %d: addresses unchanged" % cycle)
    check(tms.get_cpu_backup(weights[3]) is None, "cycle %d: no backup after resume" % cycle)
    check(tms.host_bytes() == 0, "cycle %d: no host copy held" % cycle)
    kv.fill_(cycle)
    check(int(kv[123].item()) == cycle, "cycle %d: the cache usable after resume" % cycle)
    del unrelated
gc.collect()
torch.cuda.synchronize()
check(rss() - rss0 < 256 * MiB, "host memory back to its level (RSS %+d MiB)" % ((rss() - rss0) // MiB))
# pause and resume keep no host memory once nothing is paused: the copies unmapped, and the staging ring (pinned
# by the pause) given back by the resume
be = tms._be()
lanes, mib = fabpool_memory_saver._stage_config()
want = 2 * lanes * mib * MiB
check(tms.staging_bytes() == 0, "nothing paused: no staging ring pinned (%d MiB)" % (tms.staging_bytes() // MiB))
check(be.host_mapped_bytes() == 0, "no host copy mapped after the resumes (%d bytes)" % be.host_mapped_bytes())
r0 = rss()
tms.pause()
mapped = be.host_mapped_bytes()
check(mapped >= sum(sizes) and tms.host_bytes() >= sum(sizes),
      "while paused: the weights' copies mapped (%d MiB)" % (mapped // MiB))
check(tms.staging_bytes() == want, "while paused: one staging ring of %d MiB pinned (%d MiB)" %
      (want // MiB, tms.staging_bytes() // MiB))
tms.resume()
check(be.host_mapped_bytes() == 0 and tms.staging_bytes() == 0,
      "after resume: the copies unmapped, the ring given back")
check(rss() - r0 < 64 * MiB, "a pause and resume after the first: RSS %+d MiB (nothing kept)" % ((rss() - r0) // MiB))
# the driver's and PyTorch's own host memory grow in the first cycles (the original's process: +62 MiB)
check(rss() - rss0 < 128 * MiB, "RSS since before the first pause %+d MiB (no copy, no ring kept)" %
      ((rss() - rss0) // MiB))

# retained copies: one address across resumes, refreshed by the next pause
tms.pause("weights")
first = tms.get_cpu_backup(weights[2], zero_copy=True)
p0 = first.data_ptr()
tms.retain_cpu_backup = True
del first
tms.resume("weights")
kept = tms.get_cpu_backup(weights[2], zero_copy=True)
check(kept is not None and kept.data_ptr() == p0 and torch.equal(kept, expect[2]), "retained: same address, bytes")
del kept
weights[2].fill_(7)
tms.pause("weights")
again = tms.get_cpu_backup(weights[2], zero_copy=True)
check(again.data_ptr() == p0 and bool((again == 7).all()), "the next pause refreshed the retained copy in place")
del again
tms.retain_cpu_backup = False
tms.resume("weights")
check(bool((weights[2] == 7).all()) and tms.get_cpu_backup(weights[2]) is None and tms.host_bytes() == 0,
      "resume without retain: restored, copies freed")

# a CUDA graph captured into a tag: its memory pauses with it, and it replays after the resume
with tms.region(tag="model", enable_cpu_backup=True):
    w = torch.eye(1024, device=dev)
static_in = torch.ones(256, 1024, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    (static_in @ w).sum()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with tms.cuda_graph(g, tag="graph"):
    big = torch.ones(256 * MiB, device=dev)
    out = (static_in @ w).sum() + big[:10].sum()
torch.cuda.synchronize()
del big
u0 = used()
tms.pause("graph")
tms.pause("model")
check(u0 - used() >= 256 * MiB * 4, "the graph's memory paused with its tag (%d MiB)" % ((u0 - used()) // MiB))
tms.resume("model")
tms.resume("graph")
static_in.fill_(2)
g.replay()
torch.cuda.synchronize()
check(float(out.item()) == 2.0 * 256 * 1024 + 10, "the graph replays after the resume (%s)" % out.item())

# disable(): PyTorch's own memory, untouched by a pause
with tms.region(tag="kv_cache"):
    with tms.disable():
        plain = torch.full((MiB,), 5, dtype=torch.uint8, device=dev)
tms.pause()
check(bool((plain == 5).all()), "a tensor of disable() is not paused")
tms.resume()

# the ring given back on request (nothing to give back here), pinned by the next pause, given back by its resume
tms.release_staging()
check(tms.staging_bytes() == 0, "release_staging(): no pinned ring held")
tms.pause("weights")
check(tms.staging_bytes() == want, "the next pause pins a ring again")
tms.resume("weights")
check(bool((weights[2] == 7).all()) and tms.staging_bytes() == 0,
      "its resume restores the bytes and gives the ring back")

# vLLM's CuMemAllocator: offload the default tag, discard the others
alloc = fabpool_cumem.CuMemAllocator.get_instance()
with alloc.use_memory_pool():
    vw = pattern(300 * MiB, 11)
with alloc.use_memory_pool(tag="kv_cache"):
    vkv = torch.full((512 * MiB,), 3, dtype=torch.uint8, device=dev)
vexp = vw.cpu()
check(alloc.get_current_usage() >= 812 * MiB, "get_current_usage counts both tags")
u0 = used()
alloc.sleep()
check(u0 - used() >= 800 * MiB, "sleep() gives the memory back (%d MiB)" % ((u0 - used()) // MiB))
alloc.wake_up(tags=["default"])
check(torch.equal(vw.cpu(), vexp), "wake_up(default): offloaded bytes restored")
alloc.wake_up()
vkv.fill_(4)
check(int(vkv.sum().item()) == 4 * 512 * MiB, "wake_up(): the discarded tag usable again")
alloc.sleep(offload_tags=("kv_cache",))
alloc.wake_up()
check(int(vkv.sum().item()) == 4 * 512 * MiB, "offload_tags=('kv_cache',): its bytes restored")


# vLLM's sleep with offload goes through the staging ring: about 1 GiB of weights offloaded to pageable host
# memory, a KV cache discarded, 3 cycles; the library's own offload (pinned host memory) is not used
import fabpool_torch  # noqa: E402
check(alloc.offload == "staged", "CuMemAllocator offloads through the staging ring by default")
csizes = [4096, 100_000, 3 * MiB + 5, 64 * MiB, 256 * MiB, 700 * MiB]
with alloc.use_memory_pool(tag="weights"):
    cw = [pattern(n, 100 + i) for i, n in enumerate(csizes)]
with alloc.use_memory_pool(tag="kv"):
    ckv = torch.full((512 * MiB,), 9, dtype=torch.uint8, device=dev)
cexp = [w.cpu() for w in cw]
cptrs = [w.data_ptr() for w in cw] + [ckv.data_ptr()]
cbe = alloc._be()
gc.collect()
torch.cuda.synchronize()
crss0 = rss()
for cycle in range(3):
    u0 = used()
    alloc.sleep(offload_tags=("weights",))
    u1 = used()
    check(u0 - u1 >= sum(csizes) + 512 * MiB, "cumem cycle %d: sleep gives the weights and the cache back (%d MiB)" %
          (cycle, (u0 - u1) // MiB))
    st = fabpool_torch.sleep_state("vllm.weights")
    check(st["asleep"] and st["offloaded_bytes"] == 0 and st["host_bytes"] == 0,
          "cumem cycle %d: the library slept the weights with discard, no pinned copy (%s)" % (cycle, st))
    check(alloc.host_bytes() >= sum(csizes) and cbe.host_mapped_bytes() >= sum(csizes),
          "cumem cycle %d: the weights' pageable copy mapped (%d MiB)" % (cycle, alloc.host_bytes() // MiB))
    check(alloc.staging_bytes() == want, "cumem cycle %d: one staging ring of %d MiB pinned while asleep (%d MiB)" %
          (cycle, want // MiB, alloc.staging_bytes() // MiB))
    alloc.wake_up()
    check(all(torch.equal(w.cpu(), e) for w, e in zip(cw, cexp)), "cumem cycle %d: weights bitwise" % cycle)
    check([w.data_ptr() for w in cw] + [ckv.data_ptr()] == cptrs, "cumem cycle %d: addresses unchanged" % cycle)
    check(alloc.host_bytes() == 0 and cbe.host_mapped_bytes() == 0 and alloc.staging_bytes() == 0,
          "cumem cycle %d: after wake_up the copy unmapped, the ring unpinned" % cycle)
    ckv.fill_(cycle)
    check(int(ckv[77].item()) == cycle, "cumem cycle %d: the discarded cache usable after wake_up" % cycle)
gc.collect()
torch.cuda.synchronize()
check(rss() - crss0 < 128 * MiB, "cumem: host memory back to its level after 3 cycles (RSS %+d MiB)" %
      ((rss() - crss0) // MiB))
# the library's pinned offload, still there (FABPOOL_CUMEM_OFFLOAD=pinned)
alloc.offload = "pinned"
alloc.sleep(offload_tags=("weights",))
st = fabpool_torch.sleep_state("vllm.weights")
check(st["offloaded_bytes"] >= sum(csizes) and alloc.staging_bytes() == 0,
      "offload pinned: the library's copy (%d MiB), no staging ring" % (st["offloaded_bytes"] // MiB))
alloc.wake_up()
alloc.offload = "staged"
check(all(torch.equal(w.cpu(), e) for w, e in zip(cw, cexp)), "offload pinned: weights bitwise")
del cw, ckv, cexp

print("test_rl_gpu: device memory measured by %s" % held.source)
if failures:
    print("test_rl_gpu: %d check(s) failed" % len(failures))
    sys.exit(1)
print("test_rl_gpu: all checks passed")

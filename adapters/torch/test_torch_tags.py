"""Tags, sleep and wake through the fabpool_torch module, on the
simulated driver: the allocator pairs are called the way PyTorch calls them
(no torch needed); with torch and a GPU present, a MemPool of a tag is slept
and woken too.  Usage: test_torch_tags.py <path of libfabpool_torch.so>"""
import ctypes
import os
import random
import sys

lib_path = sys.argv[1]
sys.path.insert(0, os.path.dirname(lib_path))
import fabpool_torch  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what)


lib = fabpool_torch.load()
cuda = ctypes.CDLL(os.environ.get("FABPOOL_CUDA_LIBRARY", "libcuda.so.1"))
ctx = ctypes.c_void_p()
dev = ctypes.c_int()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
cuda.cuMemcpyHtoD_v2.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
cuda.cuMemcpyDtoH_v2.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t]
sim = hasattr(cuda, "fabsim_get_ledger")


class Ledger(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("handles", "allocations", "mappings", "reservations",
                                                "exported_fds", "bytes_held", "bytes_mapped")] + \
               [("bytes_held_dev", ctypes.c_uint64 * 16), ("legacy_allocs", ctypes.c_uint64),
                ("bytes_held_host", ctypes.c_uint64), ("rest", ctypes.c_uint64 * 256)]


def ledger():
    l = Ledger()
    cuda.fabsim_get_ledger(ctypes.byref(l))
    return l


def pattern(seed, n):
    return random.Random(seed).randbytes(n)


def write(ptr, data):
    assert cuda.cuMemcpyHtoD_v2(ptr, data, len(data)) == 0


def read(ptr, n):
    buf = ctypes.create_string_buffer(n)
    assert cuda.cuMemcpyDtoH_v2(buf, ptr, n) == 0
    return buf.raw


MB = 1 << 20
held0 = ledger().bytes_held if sim else 0

# the tag "default": the installed allocator's pool, made at its first allocation
check(fabpool_torch.tags(0) == [], "no tag before any allocation")
d_ptr = lib.fabpool_torch_alloc(3 * MB, 0, None)
check(bool(d_ptr), "default allocation")
write(d_ptr, pattern(1, 3 * MB))

# MemPool tags: their allocator pairs, as PyTorch calls them
slots = {}
ptrs = {}
for tag, sizes in (("weights", [4096, 1 * MB, 24 * MB, 40 * MB]), ("kv", [2 * MB, 20 * MB])):
    k = fabpool_torch.tag_slot(tag, 0)
    slots[tag] = k
    alloc = getattr(lib, "fabpool_torch_tag%d_alloc" % k)
    alloc.restype = ctypes.c_void_p
    alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    ptrs[tag] = []
    for i, size in enumerate(sizes):
        p = alloc(size, 0, None)
        check(bool(p), "tag %s: alloc of %d" % (tag, size))
        write(p, pattern(len(tag) * 10 + i, size))
        ptrs[tag].append((p, size, len(tag) * 10 + i))
check(fabpool_torch.tag_slot("weights", 0) == slots["weights"], "a tag again: the same slot")
check(slots["weights"] != slots["kv"], "two tags: two slots")
check(sorted(fabpool_torch.tags(0)) == ["default", "kv", "weights"], "the tags listed: %s" % fabpool_torch.tags(0))
try:
    fabpool_torch.tag_slot("default", 0)
    check(False, "tag 'default' refused for a MemPool")
except fabpool_torch.FabpoolError as e:
    check("default" in str(e), "the refusal says why")

# a free while awake is kept aside until the tag sleeps (see torch_tags.c)
kfree = getattr(lib, "fabpool_torch_tag%d_free" % slots["kv"])
kfree.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
p, size, _ = ptrs["kv"].pop()
kfree(p, size, 0, None)

mapped = {t: fabpool_torch.tag_stats(t, 0)["mapped_bytes"] for t in ("default", "weights", "kv")}
check(all(m > 0 for m in mapped.values()), "every tag maps memory: %s" % mapped)
if sim:
    check(ledger().bytes_held - held0 == sum(mapped.values()), "the driver holds what the three pools map")

# sleep weights (offload) and kv (discard); default stays awake
out = fabpool_torch.sleep(tags=["weights", "kv"], offload={"weights"}, device=0)
check(out["weights"]["asleep"] and out["weights"]["mode"] == "offload" and out["weights"]["offloaded_bytes"] > 0,
      "weights offloaded: %s" % out["weights"])
check(out["kv"]["asleep"] and out["kv"]["mode"] == "discard" and out["kv"]["discarded_bytes"] > 0 and
      out["kv"]["offloaded_bytes"] == 0, "kv discarded: %s" % out["kv"])
check(not fabpool_torch.sleep_state("default", 0)["asleep"], "default awake")
check(fabpool_torch.tag_stats("weights", 0)["mapped_bytes"] == 0, "weights maps nothing asleep")
if sim:
    l = ledger()
    check(l.bytes_held - held0 == mapped["default"], "asleep: the driver holds only the awake tag's memory")
    check(l.bytes_held_host == out["weights"]["host_bytes"] > 0, "the host copies of weights")
# allocating from a sleeping tag fails (PyTorch would report OOM)
walloc = getattr(lib, "fabpool_torch_tag%d_alloc" % slots["weights"])
check(not walloc(4096, 0, None), "no allocation from a sleeping tag")
try:
    fabpool_torch.sleep(tags="weights", device=0)
    check(False, "sleep twice refused")
except fabpool_torch.FabpoolError as e:
    check("asleep" in str(e), "sleep twice: %s" % e)
try:
    fabpool_torch.wake(tags="nosuchtag", device=0)
    check(False, "an unknown tag refused")
except fabpool_torch.FabpoolError as e:
    check("nosuchtag" in str(e), "an unknown tag: %s" % e)
try:
    fabpool_torch.sleep(tags=["default"], offload={"weights"}, device=0)
    check(False, "offload of a tag not put to sleep refused")
except fabpool_torch.FabpoolError:
    pass
check(not fabpool_torch.sleep_state("default", 0)["asleep"], "a refused sleep changed nothing")

woke = fabpool_torch.wake(device=0)  # every sleeping tag
check(sorted(woke) == ["kv", "weights"], "wake() wakes the sleeping tags: %s" % sorted(woke))
check(not fabpool_torch.sleep_state("weights", 0)["asleep"] and fabpool_torch.sleep_state("weights", 0)["wakes"] == 1,
      "weights awake")
for p, size, seed in ptrs["weights"]:
    check(read(p, size) == pattern(seed, size), "weights: %d bytes at 0x%x back" % (size, p))
check(read(d_ptr, 3 * MB) == pattern(1, 3 * MB), "default untouched")
for p, size, seed in ptrs["kv"]:  # discarded: usable again
    write(p, pattern(seed + 1, size))
    check(read(p, size) == pattern(seed + 1, size), "kv usable after wake")
if sim:
    check(ledger().bytes_held_host == 0, "the host copies freed")
    check(ledger().bytes_held - held0 <= sum(mapped.values()), "wake maps no more than before")
check(fabpool_torch.sleep_state("kv", 0)["discarded_bytes"] > 0, "kv reported discarded after wake")

# with torch and a GPU: a MemPool of a tag keeps its tensors' data_ptr through sleep and wake
try:
    import torch
    have_torch = torch.cuda.is_available()
except ImportError:
    have_torch = False
if have_torch:
    pool = fabpool_torch.mempool(tag="t_weights")
    with torch.cuda.use_mem_pool(pool):
        x = torch.randn(1 << 22, device="cuda")
    before, ptr = x.sum().item(), x.data_ptr()
    fabpool_torch.sleep(tags="t_weights")
    fabpool_torch.wake(tags="t_weights")
    check(x.data_ptr() == ptr and x.sum().item() == before, "torch: a tensor of a tag kept its data_ptr and data")
else:
    print("test_torch_tags: no torch with CUDA here: the MemPool part is skipped")

lib.fabpool_torch_free(d_ptr, 3 * MB, 0, None)


# shutdown: refused while the tags hold blocks (each named), then every pool gone, the tags' too (without
# torch: with it, PyTorch's caching allocator still holds the MemPool's segments)
def check_shutdown():
    try:
        fabpool_torch.shutdown()
        check(False, "shutdown refused while tags have live blocks")
    except fabpool_torch.FabpoolError as e:
        check("'weights'" in str(e) and "'kv'" in str(e), "the refusal names the busy tags: %s" % e)
    check(sorted(fabpool_torch.tags(0)) == ["kv", "weights"], "the busy tags stay: %s" % fabpool_torch.tags(0))
    for tag in ("weights", "kv"):
        tfree = getattr(lib, "fabpool_torch_tag%d_free" % slots[tag])
        tfree.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        for p, size, _ in ptrs[tag]:
            tfree(p, size, 0, None)
    fabpool_torch.shutdown()
    check(fabpool_torch.tags(0) == [], "no tag after shutdown: %s" % fabpool_torch.tags(0))
    if sim:
        check(ledger().bytes_held == held0 and ledger().mappings == 0 and ledger().reservations == 0,
              "the driver holds nothing after shutdown")


if have_torch:
    print("test_torch_tags: torch holds a MemPool: the shutdown part is skipped")
else:
    check_shutdown()
if failures:
    print("test_torch_tags: %d failed" % len(failures))
    sys.exit(1)
print("test_torch_tags: all passed")

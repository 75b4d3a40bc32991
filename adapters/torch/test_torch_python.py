"""libfabpool_torch.so in a running Python, through the fabpool_torch module
and ctypes, as torch.cuda.memory.CUDAPluggableAllocator loads it (no torch
here: the allocator's functions are called the way PyTorch calls them).  The
only environment is the simulated driver's path.  Usage:
test_torch_python.py <path of libfabpool_torch.so>"""
import ctypes
import os
import sys

lib_path = sys.argv[1]
# the module lies next to the library in the build tree: it must find the
# library there by itself
sys.path.insert(0, os.path.dirname(lib_path))
import fabpool_torch  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what)


lib = fabpool_torch.load()
check(os.path.samefile(fabpool_torch.library_path(), lib_path), "the module found the library next to it")
check(not hasattr(lib, "fabpool_alloc"), "only the PyTorch ABI is exported")

# the driver, for the copies and (simulated) the ledger
cuda = ctypes.CDLL(os.environ.get("FABPOOL_CUDA_LIBRARY", "libcuda.so.1"))
ctx = ctypes.c_void_p()
dev = ctypes.c_int()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
stream = ctypes.c_void_p()
assert cuda.cuStreamCreate(ctypes.byref(stream), 0) == 0


class Ledger(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("handles", "allocations", "mappings", "reservations",
                                                "exported_fds", "bytes_held", "bytes_mapped")] + \
               [("bytes_held_dev", ctypes.c_uint64 * 16), ("legacy_allocs", ctypes.c_uint64),
                ("rest", ctypes.c_uint64 * 256)]  # room for the fields the sim adds: it fills its whole struct


def held():
    if not hasattr(cuda, "fabsim_get_ledger"):
        return None
    l = Ledger()
    cuda.fabsim_get_ledger(ctypes.byref(l))
    return l.bytes_held


held0 = held()
sizes = [256, 1000, 4096, 1 << 20, 3 << 20, 16 << 20]
ptrs = []
for i, size in enumerate(sizes * 3):
    s = stream if i % 2 else None
    p = lib.fabpool_torch_alloc(size, 0, s)
    check(p is not None and p % 256 == 0, "alloc(%d) gives an aligned pointer" % size)
    data = bytes([(i * 7 + k) % 251 for k in range(64)])
    cuda.cuMemcpyHtoD_v2(ctypes.c_uint64(p), data, ctypes.c_size_t(64))
    ptrs.append((p, size, s, data))

st = fabpool_torch.stats(0)
c = fabpool_torch.counters(0)
check(st["torch"]["allocs"] == len(ptrs) == c["allocs"], "the counters count every allocation")
check(st["pool"]["blocks"] == c["blocks_live"] + c["cached_blocks"] == len(ptrs), "the pool holds every live block")
check(st["pool"]["in_use_bytes"] == c["usable_bytes_live"], "bytes in use agree")
check(st["pool"]["handle_type"] == "none", "local memory by default")
print("stats: %d allocs, %d blocks, %d bytes mapped, metadata in %s" %
      (c["allocs"], st["pool"]["blocks"], st["pool"]["mapped_bytes"], st["pool"]["metadata_allocator"]))

for p, size, s, data in ptrs:
    back = ctypes.create_string_buffer(64)
    cuda.cuMemcpyDtoH_v2(back, ctypes.c_uint64(p), ctypes.c_size_t(64))
    check(back.raw == data, "data written at %#x survives" % p)
    lib.fabpool_torch_free(p, size, 0, s)

# same stream again: the block freed last on it comes back
p, size, s, _ = ptrs[-1]
q = lib.fabpool_torch_alloc(size, 0, s)
check(q == p, "the block freed last on its stream is reused at once")
lib.fabpool_torch_free(q, size, 0, s)

# errors: NULL and a message
lib.fabpool_torch_set_verbose(0)
check(lib.fabpool_torch_alloc(256, 42, None) is None and "device 42" in fabpool_torch.last_error(),
      "a bad device gives NULL and a message")
try:
    fabpool_torch.stats(5)
    check(False, "stats of a device without a pool raise")
except fabpool_torch.FabpoolError as e:
    check("no pool" in str(e), "the error says the device has no pool")

# ---- PyTorch's statistics from the shim, without torch
import types  # noqa: E402

fabpool_torch.reset_peak_memory_stats(0)
before = fabpool_torch.memory_stats(0)
sizes2 = [512, 700000, 3 << 20, 40 << 20]
live2 = [(lib.fabpool_torch_alloc(n, 0, stream), n) for n in sizes2]
check(all(p for p, _ in live2), "allocations for the stats")
ms = fabpool_torch.memory_stats(0)
c = fabpool_torch.counters(0)
pool = fabpool_torch.stats(0)["pool"]
check(list(ms.keys()) == sorted(ms.keys()), "memory_stats() is sorted, as PyTorch's")
check(ms["requested_bytes.all.current"] == c["bytes_live"] and
      ms["requested_bytes.all.current"] - before["requested_bytes.all.current"] == sum(sizes2),
      "requested_bytes: the sizes asked (%d)" % ms["requested_bytes.all.current"])
check(ms["allocated_bytes.all.current"] == c["usable_bytes_live"] == ms["active_bytes.all.current"],
      "allocated_bytes: the block sizes (%d)" % ms["allocated_bytes.all.current"])
check(ms["allocation.all.current"] == c["blocks_live"] == 4 and ms["allocation.small_pool.current"] == 2 and
      ms["allocation.large_pool.current"] == 2, "allocations counted, split at 1 MiB")
check(ms["allocated_bytes.all.peak"] >= ms["allocated_bytes.all.current"], "peak >= current")
check(ms["reserved_bytes.all.current"] == pool["mapped_bytes"], "reserved_bytes: what fabpool maps")
if held0 is not None:
    check(ms["reserved_bytes.all.current"] == held() - held0, "reserved_bytes: what the driver holds")
check(ms["num_device_alloc"] == pool["chunks_mapped_total"] and ms["segment.all.current"] == pool["chunks_mapped"],
      "segments: fabpool's chunks")
# every key PyTorch's memory_summary reads (torch/cuda/memory.py)
need = ["num_ooms", "num_alloc_retries"]
for metric in ("allocated_bytes", "active_bytes", "requested_bytes", "reserved_bytes", "inactive_split_bytes",
               "allocation", "active", "segment", "inactive_split"):
    for pool_name in ("all", "large_pool", "small_pool"):
        need += ["%s.%s.%s" % (metric, pool_name, f) for f in ("current", "peak", "allocated", "freed")]
for metric in ("oversize_allocations", "oversize_segments"):
    need += ["%s.%s" % (metric, f) for f in ("current", "peak", "allocated", "freed")]
missing = [k for k in need if k not in ms]
check(not missing, "every key memory_summary reads is there (missing: %s)" % missing)
check(all(isinstance(v, int) for v in ms.values()), "all values are ints")
check(fabpool_torch.memory_stats("cuda:0") == ms and fabpool_torch.memory_stats() == ms,
      "device as 'cuda:0' and None (device 0 without torch)")
nested = fabpool_torch.memory_stats_as_nested_dict(0)
check(nested["allocated_bytes"]["all"]["current"] == ms["allocated_bytes.all.current"], "the nested form")

# install(stats=True)'s patching, on a stand-in for torch whose statistics
# raise what PyTorch 2.11 raises with a pluggable allocator
GET_STATS_ERROR = "CUDAPluggableAllocator does not yet support getDeviceStats"


def raising(*args, **kwargs):
    raise RuntimeError(GET_STATS_ERROR)


fake = types.ModuleType("torch")
fake.cuda = types.ModuleType("torch.cuda")
fake.cuda.memory = types.ModuleType("torch.cuda.memory")
fake.accelerator = types.ModuleType("torch.accelerator")
for mod in (fake.cuda, fake.cuda.memory, fake.accelerator):
    for name in ("memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "reset_peak_memory_stats", "reset_accumulated_memory_stats"):
        setattr(mod, name, raising)
fake.cuda.memory.memory_summary = lambda device=None: "%d" % fake.cuda.memory.memory_stats(device=device)[
    "allocated_bytes.all.current"]   # PyTorch's reads memory_stats from its module, as this does
fake.cuda.memory_summary = fake.cuda.memory.memory_summary
try:
    fake.cuda.max_memory_allocated()
    check(False, "the stand-in raises before the patch")
except RuntimeError as e:
    check(GET_STATS_ERROR in str(e), "the stand-in raises PyTorch's message")
fabpool_torch.patch_torch_stats(fake)
fabpool_torch.patch_torch_stats(fake)   # twice: still undoable
check(fake.cuda.max_memory_allocated() == ms["allocated_bytes.all.peak"] and
      fake.cuda.memory.memory_allocated(0) == ms["allocated_bytes.all.current"] and
      fake.cuda.memory_reserved() == ms["reserved_bytes.all.current"] and
      fake.cuda.max_memory_reserved(0) == ms["reserved_bytes.all.peak"] and
      fake.accelerator.memory_allocated() == ms["allocated_bytes.all.current"],
      "after the patch torch.cuda's and torch.accelerator's statistics answer from fabpool")
check(fake.cuda.memory_summary() == str(ms["allocated_bytes.all.current"]), "memory_summary reads the patched stats")
p_big, n_big = live2.pop()
lib.fabpool_torch_free(p_big, n_big, 0, stream)
check(fake.cuda.memory_allocated() == ms["allocated_bytes.all.current"] - (fabpool_torch.memory_stats()[
      "allocated_bytes.all.freed"] - ms["allocated_bytes.all.freed"]) and
      fake.cuda.max_memory_allocated() == ms["allocated_bytes.all.peak"], "a free lowers current, not peak")
fake.cuda.reset_peak_memory_stats()
check(fake.cuda.max_memory_allocated() == fake.cuda.memory_allocated() < ms["allocated_bytes.all.peak"],
      "reset_peak_memory_stats brings the peak to the current value")
fake.cuda.memory.reset_accumulated_memory_stats(0)
check(fabpool_torch.memory_stats()["allocation.all.allocated"] == 0, "reset_accumulated_memory_stats")
fabpool_torch.unpatch_torch_stats()
check(fake.cuda.memory_allocated is raising and fake.cuda.memory.memory_stats is raising,
      "unpatch puts PyTorch's functions back")
for p, n in live2:
    lib.fabpool_torch_free(p, n, 0, stream)
check(fabpool_torch.memory_stats()["allocation.all.current"] == 0, "all freed")
# a bad free is refused and counted
lib.fabpool_torch_free(live2[0][0], live2[0][1], 0, stream)
check(fabpool_torch.counters(0)["bad_frees"] == 1 and "not a live allocation" in fabpool_torch.last_error(),
      "a double free is refused")

fabpool_torch.empty()
c = fabpool_torch.counters()
check(c["cached_blocks"] == 0 and c["blocks_live"] == 0 and c["frees"] == c["allocs"], "empty leaves nothing cached")
if held0 is not None:
    check(held() == held0, "after empty the driver holds what it held before (%s bytes, was %s)" % (held(), held0))
fabpool_torch.shutdown()
cuda.cuStreamDestroy_v2(stream)
print("%d passed, %d failed" % (1 if not failures else 0, len(failures)))
sys.exit(1 if failures else 0)

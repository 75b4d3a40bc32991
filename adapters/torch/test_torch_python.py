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
               [("bytes_held_dev", ctypes.c_uint64 * 16), ("legacy_allocs", ctypes.c_uint64)]


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

fabpool_torch.empty()
c = fabpool_torch.counters()
check(c["cached_blocks"] == 0 and c["blocks_live"] == 0 and c["frees"] == c["allocs"], "empty leaves nothing cached")
if held0 is not None:
    check(held() == held0, "after empty the driver holds what it held before (%s bytes, was %s)" % (held(), held0))
fabpool_torch.shutdown()
cuda.cuStreamDestroy_v2(stream)
print("%d passed, %d failed" % (1 if not failures else 0, len(failures)))
sys.exit(1 if failures else 0)

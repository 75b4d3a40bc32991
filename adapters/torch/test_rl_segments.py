"""The segment requests of perf/rl_pause_resume.py's workload, as PyTorch's
caching allocator makes them inside torch_memory_saver regions, replayed
through fabpool_torch's tag pools on the simulated driver, with the driver
calls each costs counted (fabsim_calls): the tag pool's creation, the
first fill of the weights (weight_sizes(), seed 1) and the KV cache (a chunk
a segment at most: the tag pools map large blocks whole), and
rounds of {allocate tensors of 1-64 MiB, free them, empty the cache} (an RL
framework between phases).  torch_memory_saver makes one cuMemCreate,
cuMemAddressReserve, cuMemMap and cuMemSetAccess per segment; the numbers
here are fabpool's.  No torch.  Usage: test_rl_segments.py <libfabpool_torch.so>"""
import ctypes
import os
import random
import sys

lib_path = sys.argv[1]
sys.path.insert(0, os.path.dirname(lib_path))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "perf"))
import fabpool_torch  # noqa: E402
from rl_pause_resume import weight_sizes  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what)


cuda = ctypes.CDLL(os.environ.get("FABPOOL_CUDA_LIBRARY", "libcuda.so.1"))
if not hasattr(cuda, "fabsim_calls"):
    print("test_rl_segments: not the simulated driver (no fabsim_calls); nothing to count")
    sys.exit(77)
cuda.fabsim_calls.restype, cuda.fabsim_calls.argtypes = ctypes.c_uint64, [ctypes.c_char_p]
cuda.fabsim_range_mapped.restype, cuda.fabsim_range_mapped.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_size_t]
ctx, dev = ctypes.c_void_p(), ctypes.c_int()
assert cuda.cuInit(0) == 0
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0
lib = fabpool_torch.load()

CALLS = ("cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemAddressReserve", "cuMemExportToShareableHandle",
         "cuMemUnmap")


def counts():
    return {c: cuda.fabsim_calls(c.encode()) for c in CALLS}


def since(c0):
    c1 = counts()
    return {c: c1[c] - c0[c] for c in CALLS}


def segment_requests(sizes):
    """The segments PyTorch's caching allocator asks its backend for, allocating `sizes` in turn with nothing
    freed: a request rounded to 512 bytes comes from a cached block where one fits (best fit, the rest split
    off: in the small pool whatever is left, in the large one above 1 MiB); else a new segment: 2 MiB for up
    to 1 MiB, 20 MiB below 10 MiB, the size rounded up to 2 MiB above."""
    small, large, segs = [], [], []
    for n in sizes:
        n = max(512, (n + 511) // 512 * 512)
        pool = small if n <= MiB else large
        fits = [b for b in pool if b >= n]
        if fits:
            b = min(fits)
            pool.remove(b)
        else:
            b = 2 * MiB if n <= MiB else 20 * MiB if n < 10 * MiB else (n + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
            segs.append(b)
        if b - n > (0 if pool is small else MiB):
            pool.append(b - n)
    return segs


def pair(tag):
    c0 = counts()
    k = fabpool_torch.tag_slot(tag, 0)
    made = since(c0)
    alloc = getattr(lib, "fabpool_torch_tag%d_alloc" % k)
    free = getattr(lib, "fabpool_torch_tag%d_free" % k)
    alloc.restype, alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    free.restype, free.argtypes = None, [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    return alloc, free, made


def fill(alloc, segs, what):
    """Allocates each segment; returns the pointers and the calls (in all, and the most for one segment)."""
    c0, ptrs, most = counts(), [], 0
    for n in segs:
        c = counts()
        p = alloc(n, 0, None)
        check(p and cuda.fabsim_range_mapped(p, n) == 1, "%s: a segment of %d bytes mapped" % (what, n))
        most = max(most, since(c)["cuMemCreate"])
        ptrs.append(p)
    return ptrs, since(c0), most


# the tag pools' creation
alloc_w, free_w, made_w = pair("tms.b.weights")
alloc_kv, free_kv, made_kv = pair("tms.n.kv_cache")
print("tag pool creation: %s" % made_w)
for made, tag in ((made_w, "weights"), (made_kv, "kv_cache")):
    check(made["cuMemCreate"] == 0 and made["cuMemExportToShareableHandle"] == 0,
          "the %s tag's pool made without a chunk or an export (no handle probe): %s" % (tag, made))
    check(made["cuMemAddressReserve"] == 1, "the %s tag's pool reserves its address space once" % tag)

# the first fill
wsegs = segment_requests(weight_sizes(3 * GiB))
kvsegs = segment_requests([GiB // 2] * 4)
wp, wc, wmost = fill(alloc_w, wsegs, "weights")
kp, kc, kmost = fill(alloc_kv, kvsegs, "kv_cache")
for what, segs, c, most in (("weights", wsegs, wc, wmost), ("kv_cache", kvsegs, kc, kmost)):
    print("first fill, %s: %d segments (%d MiB): %d cuMemCreate (at most %d for one segment), %d cuMemMap, "
          "%d cuMemSetAccess, %d reservations, %d exports; torch_memory_saver: %d of each" %
          (what, len(segs), sum(segs) // MiB, c["cuMemCreate"], most, c["cuMemMap"], c["cuMemSetAccess"],
           c["cuMemAddressReserve"], c["cuMemExportToShareableHandle"], len(segs)))
    check(c["cuMemAddressReserve"] == 0 and c["cuMemExportToShareableHandle"] == 0,
          "%s: no reservation and no export while filling" % what)
    check(c["cuMemCreate"] == c["cuMemMap"] == c["cuMemSetAccess"], "%s: one map and one access per chunk" % what)
    # the tag pools map a segment as one chunk (large_chunks:whole; at most max_chunk, 1 GiB), some segments
    # in one chunk mapped ahead: no more than torch_memory_saver's one per segment
    check(most <= 1 and c["cuMemCreate"] <= len(segs),
          "%s: %d chunks for %d segments, at most %d for one (one a segment at most)" %
          (what, c["cuMemCreate"], len(segs), most))

# rounds of new shapes: allocated, freed, the cache emptied (every segment back to the pool)
rng = random.Random(3)
again = [0, 0]   # rounds after the first: chunks made, segments asked for
for r in range(4):
    segs = segment_requests([rng.randint(1 * MiB, 64 * MiB) for _ in range(24)])
    ptrs, c, most = fill(alloc_w, segs, "round %d" % r)
    for p, n in zip(ptrs, segs):
        free_w(p, n, 0, None)
    print("round %d: %d segments (%d MiB): %d cuMemCreate, %d cuMemUnmap" %
          (r, len(segs), sum(segs) // MiB, c["cuMemCreate"], c["cuMemUnmap"]))
    if r:
        again[0] += c["cuMemCreate"]
        again[1] += len(segs)
# the pool keeps what the cache gave back mapped (decay_ms): new shapes are cut from it, where
# torch_memory_saver makes and maps every segment again
check(again[0] * 2 <= again[1], "rounds after the first: %d chunks made for %d segments" % tuple(again))
for p, n in zip(wp, wsegs):
    free_w(p, n, 0, None)
for p, n in zip(kp, kvsegs):
    free_kv(p, n, 0, None)
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("test_rl_segments: all checks passed")

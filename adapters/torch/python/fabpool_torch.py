"""fabpool as PyTorch's CUDA allocator.

    import fabpool_torch
    fabpool_torch.install()          # before the first CUDA tensor
    ...
    fabpool_torch.stats()            # dict: {"device", "torch": counters, "pool": fabpool stats}
    fabpool_torch.empty()            # everything cached back to the driver

install() loads libfabpool_torch.so through torch.cuda.memory.CUDAPluggableAllocator
and makes it the current allocator (torch.cuda.memory.change_current_allocator),
which PyTorch allows only before its allocator has been used.  The library is
looked for in this order: the `path` argument, $FABPOOL_TORCH_LIBRARY, next to
this file, then the dynamic loader's search path.  Pool options come from
$FABPOOL_CONF (docs/config.md); the driver from $FABPOOL_CUDA_LIBRARY or
libcuda.so.1.

The functions other than install() use ctypes only, so they also work without
torch (the tests of this package call the library that way).
"""
import ctypes
import json
import os

__all__ = ["install", "load", "library_path", "stats", "counters", "empty", "shutdown", "last_error",
           "FabpoolError"]

_LIB_NAME = "libfabpool_torch.so"
_lib = None
_lib_path = None
_allocator = None   # keeps PyTorch's allocator object alive


class FabpoolError(RuntimeError):
    """A fabpool call failed; the message says what went wrong and what to do."""


class Counters(ctypes.Structure):
    # the order of fabpool_torch_counters in include/fabpool_torch.h
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "allocs", "frees", "alloc_failures", "blocks_live", "bytes_live", "usable_bytes_live", "bytes_live_peak",
        "reuse_same_stream", "reuse_after_event", "pool_allocs", "pool_frees", "cached_blocks", "cached_bytes",
        "events_recorded", "event_queries", "syncs", "streams", "empties", "bad_frees")]

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_}


def library_path(path=None):
    """The libfabpool_torch.so that load() would use."""
    candidates = []
    if path:
        candidates.append(path)
    env = os.environ.get("FABPOOL_TORCH_LIBRARY")
    if env:
        candidates.append(env)
    here = os.path.dirname(os.path.abspath(__file__))
    candidates += [os.path.join(here, _LIB_NAME), os.path.join(here, "lib", _LIB_NAME)]
    for c in candidates:
        if os.path.isfile(c):
            return os.path.abspath(c)
    if path or env:
        raise FabpoolError("fabpool_torch: %s does not exist; build it (cmake --build <dir> --target fabpool_torch) "
                           "and pass its path" % (path or env))
    return _LIB_NAME   # let the dynamic loader search (LD_LIBRARY_PATH, ldconfig)


def load(path=None):
    """Loads the library with ctypes (once) and declares its functions."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    p = library_path(path)
    try:
        lib = ctypes.CDLL(p)
    except OSError as e:
        raise FabpoolError("fabpool_torch: cannot load %s: %s; set FABPOOL_TORCH_LIBRARY to the library's path" %
                           (p, e)) from None
    lib.fabpool_torch_alloc.restype = ctypes.c_void_p
    lib.fabpool_torch_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.fabpool_torch_free.restype = None
    lib.fabpool_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.fabpool_torch_empty.restype = ctypes.c_int
    lib.fabpool_torch_empty.argtypes = [ctypes.c_int]
    lib.fabpool_torch_stats_json.restype = ctypes.c_int
    lib.fabpool_torch_stats_json.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                             ctypes.POINTER(ctypes.c_size_t)]
    lib.fabpool_torch_get_counters.restype = ctypes.c_int
    lib.fabpool_torch_get_counters.argtypes = [ctypes.c_int, ctypes.POINTER(Counters)]
    lib.fabpool_torch_last_error.restype = ctypes.c_char_p
    lib.fabpool_torch_last_error.argtypes = []
    lib.fabpool_torch_set_verbose.restype = ctypes.c_int
    lib.fabpool_torch_set_verbose.argtypes = [ctypes.c_int]
    lib.fabpool_torch_shutdown.restype = ctypes.c_int
    lib.fabpool_torch_shutdown.argtypes = []
    _lib, _lib_path = lib, p
    return lib


def last_error():
    """The calling thread's message for its last failed call."""
    return load().fabpool_torch_last_error().decode(errors="replace")


def _check(status, what):
    if status != 0:
        raise FabpoolError("%s failed (status %d): %s" % (what, status, last_error()))


def install(path=None):
    """Makes fabpool PyTorch's CUDA allocator.  Call it before any CUDA tensor
    is made (PyTorch refuses to swap an allocator that has been used).
    Returns the library's path."""
    global _allocator
    import torch
    load(path)
    if _allocator is not None:
        return _lib_path
    # CUDAPluggableAllocator opens the same file with ctypes (the same handle)
    # and hands PyTorch the two function pointers.
    alloc = torch.cuda.memory.CUDAPluggableAllocator(_lib_path, "fabpool_torch_alloc", "fabpool_torch_free")
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise FabpoolError("fabpool_torch.install(): PyTorch refused the allocator (%s); call install() before the "
                           "first CUDA tensor or CUDA call that allocates" % e) from None
    _allocator = alloc
    return _lib_path


def stats(device=0):
    """The device's pool stats and the allocator's counters, as a dict."""
    lib = load()
    need = ctypes.c_size_t(0)
    st = lib.fabpool_torch_stats_json(device, None, 0, ctypes.byref(need))
    if st not in (0, 10):   # 10: FABPOOL_ERR_LIMIT, the size is in need
        _check(st, "fabpool_torch_stats_json(device %d)" % device)
    buf = ctypes.create_string_buffer(need.value + 256)
    _check(lib.fabpool_torch_stats_json(device, buf, len(buf), ctypes.byref(need)),
           "fabpool_torch_stats_json(device %d)" % device)
    return json.loads(buf.value.decode())


def counters(device=-1):
    """The allocator's counters (allocs, frees, bytes live, reuse, cached...) as a dict; -1: all devices."""
    c = Counters()
    _check(load().fabpool_torch_get_counters(device, ctypes.byref(c)), "fabpool_torch_get_counters")
    return c.as_dict()


def empty(device=-1):
    """Returns every cached block to the driver, once the work on its stream is
    done; -1: every device.  torch.cuda.empty_cache() does not reach a
    pluggable allocator, so call this instead."""
    _check(load().fabpool_torch_empty(device), "fabpool_torch_empty(%d)" % device)


def shutdown():
    """Empties and destroys every pool (all tensors must be freed first)."""
    _check(load().fabpool_torch_shutdown(), "fabpool_torch_shutdown")

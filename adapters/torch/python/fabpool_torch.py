"""fabpool as PyTorch's CUDA allocator.

    import fabpool_torch
    fabpool_torch.install()          # before the first CUDA tensor
    ...
    torch.cuda.max_memory_allocated()  # answered by fabpool
    fabpool_torch.stats()            # dict: {"device", "torch": counters, "pool": fabpool stats}
    torch.cuda.empty_cache()         # everything cached back to the driver

install() makes fabpool PyTorch's allocator in one of two ways:

- the C++ allocator, libfabpool_torch_cxx.so (built by fabpool's CMake where
  python3 imports torch, against that torch): a whole
  c10::cuda::CUDACachingAllocator::CUDAAllocator, which keeps PyTorch's
  contract: record_stream, torch.OutOfMemoryError, the memory fraction,
  torch.cuda's statistics and empty_cache, CUDA graph pools and
  torch.compile's reduce-overhead mode (docs/integration.md);
- the pluggable shim, libfabpool_torch.so, through
  torch.cuda.memory.CUDAPluggableAllocator, which forwards only malloc and
  free.  install() falls back to it, with one warning that names what does
  not work then, where the C++ allocator is missing or was built against
  another PyTorch.  install(stats=True) patches torch.cuda's statistics
  functions for it.

Or, keeping PyTorch's allocator for everything else, a scoped pool:

    pool = fabpool_torch.mempool()   # a torch.cuda.MemPool whose segments come from fabpool
    with torch.cuda.use_mem_pool(pool):
        buf = torch.empty(...)

PyTorch allows a new allocator only before its own has been used (before the
first CUDA tensor or CUDA call).  The shim's library is looked for in this
order: the `path` argument, $FABPOOL_TORCH_LIBRARY, next to this file, then
the dynamic loader's search path; the C++ allocator's in
$FABPOOL_TORCH_CXX_LIBRARY, next to the shim's library, next to this file.
$FABPOOL_TORCH_MODE (or install(mode=...)) picks one: auto (the default),
cxx or shim.  Pool options come from $FABPOOL_CONF (docs/config.md); the
driver from $FABPOOL_CUDA_LIBRARY or libcuda.so.1.

The functions other than install() use ctypes only, so they also work without
torch (the tests of this package call the library that way).
"""
import atexit
import collections
import ctypes
import json
import os
import sys

__all__ = ["build_info", "install", "installed", "cpp_view", "cxx_library_path", "SHIM_LIMITS", "load", "library_path", "stats", "counters", "empty", "shutdown", "last_error",
           "memory_stats", "memory_stats_as_nested_dict", "reset_peak_memory_stats",
           "reset_accumulated_memory_stats", "patch_torch_stats", "unpatch_torch_stats", "mempool", "FabpoolError",
           "sleep", "wake", "sleep_state", "tags"]

# The version and build id of the build that configured this file: CMake writes them into the copy it puts
# beside the library (<build>/adapters/torch) and installs (cmake --install, the wheel), and load() refuses a
# library that says another.  The file in the source tree is not filled in: it takes whatever library it loads.
_BUILT_WITH = ("@PROJECT_VERSION@",
               "@FABPOOL_TORCH_BUILD_ID@")
_CONFIGURED = not _BUILT_WITH[1].startswith("@")
# The PyTorch version the same build made libfabpool_torch_cxx.so for ("" where it made none: the shim only)
_CXX_BUILT_FOR = "@FABPOOL_TORCH_CXX_BUILT_FOR@"
if _CONFIGURED:
    __version__ = _BUILT_WITH[0]

_LIB_NAME = "libfabpool_torch.so"
_CXX_LIB_NAME = "libfabpool_torch_cxx.so"
_lib = None
_lib_path = None
_pluggable = None   # the CUDAPluggableAllocator of this library, made once and kept alive
_allocator = None   # what install() made PyTorch's allocator: _pluggable, or "cxx" for the C++ allocator
_patched = {}       # (module, name) -> PyTorch's function that patch_torch_stats replaced
_fallback_warned = False

# what the pluggable shim cannot do, said when install() falls back to it
SHIM_LIMITS = (
    "record_stream is ignored: a tensor freed while another stream still reads it can be given out again",
    "an allocation fabpool cannot serve raises a RuntimeError that begins 'CUDA out of memory.', not "
    "torch.OutOfMemoryError: an except clause for that class alone misses it",
    "torch.cuda.set_per_process_memory_fraction is ignored",
    "torch.cuda.memory_stats() and the functions built on it raise unless install(stats=True), and then only "
    "from Python; empty_cache() does nothing without it",
    "CUDA graphs that share a pool and torch.compile(mode='reduce-overhead') fail",
    "CUDA tensors cannot be shared with other processes (torch.multiprocessing)",
)


class FabpoolError(RuntimeError):
    """A fabpool call failed; the message says what went wrong and what to do."""


class _Sized(ctypes.Structure):
    """A struct the library fills: it begins with struct_size, set here to the
    structure's size, which the library checks against its own (fabpool.h)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.struct_size = ctypes.sizeof(self)

    def as_dict(self):
        return {name: getattr(self, name) for name, _ in self._fields_ if name != "struct_size"}


class _SleepInfoBase(_Sized):
    def as_dict(self):
        d = super().as_dict()
        d["asleep"] = bool(d["asleep"])
        d["mode"] = "offload" if self.mode == 1 else "discard"
        return d


# The structs the library fills, as ctypes classes made at load from the
# library's own description of them (fabpool_torch_struct_layout): the C
# struct -> this module's name for it and the class it is made from.
_STRUCTS = {
    "fabpool_sleep_info": ("SleepInfo", _SleepInfoBase),
    "fabpool_torch_counters": ("Counters", _Sized),
    "fabpool_torch_stat": ("_Stat", ctypes.Structure),
    "fabpool_torch_mem_stats": ("_MemStats", _Sized),
    "fabpool_torch_symm_info": ("SymmInfo", ctypes.Structure),   # fabpool_symm.py's
}
_SCALARS = {"i32": ctypes.c_int32, "u32": ctypes.c_uint32, "i64": ctypes.c_int64, "u64": ctypes.c_uint64}
Counters = SleepInfo = _Stat = _MemStats = SymmInfo = None   # made by load()
_layout = None      # the description they were made from


def _field_type(ftype, size, made):
    if ftype.endswith("[]"):
        elem = made[ftype[:-2]]
        return elem * (size // ctypes.sizeof(elem))
    return made[ftype] if ftype in made else _SCALARS[ftype]


def _make_structs(lib, p):
    """The ctypes classes of the structs lib fills, from its description of
    them (once: a second library must describe the same layout)."""
    global _layout
    lib.fabpool_torch_struct_layout.restype = ctypes.c_char_p
    lib.fabpool_torch_struct_layout.argtypes = []
    text = lib.fabpool_torch_struct_layout().decode()
    if _layout is not None:
        if text != _layout:
            raise FabpoolError("fabpool_torch: %s lays its structs out unlike the library loaded first" % p)
        return
    made = {}
    for cname, desc in json.loads(text).items():   # a struct comes before the structs that hold it
        fields = sorted(desc["fields"].items(), key=lambda kv: kv[1][0])
        pyname, base = _STRUCTS.get(cname, (cname, _Sized if fields[0][0] == "struct_size" else ctypes.Structure))
        cls = type(pyname, (base,), {"_fields_": [(name, _field_type(t, size, made))
                                                  for name, (_, size, t) in fields]})
        wrong = [name for name, (off, size, _) in fields
                 if (getattr(cls, name).offset, getattr(cls, name).size) != (off, size)]
        if ctypes.sizeof(cls) != desc["size"] or wrong:
            raise FabpoolError("fabpool_torch: %s describes %s (%d bytes) in a layout ctypes does not give "
                               "(%d bytes; fields %s)" % (p, cname, desc["size"], ctypes.sizeof(cls), wrong))
        made[cname] = cls
    for cname, cls in made.items():
        globals()[cls.__name__] = cls
    _layout = text


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
    """Loads the library with ctypes (once) and declares its functions: the
    C++ allocator's once install() has installed it, else the shim's."""
    if _lib is not None:
        return _lib
    p = library_path(path)
    try:
        lib = ctypes.CDLL(p)
    except OSError as e:
        raise FabpoolError("fabpool_torch: cannot load %s: %s; set FABPOOL_TORCH_LIBRARY to the library's path" %
                           (p, e)) from None
    return _use(lib, p)


def _library_build(lib):
    """(version, build id) that a loaded library says; "none" for a library without a build id."""
    lib.fabpool_torch_version.restype = ctypes.c_char_p
    lib.fabpool_torch_version.argtypes = []
    try:
        lib.fabpool_torch_build_id.restype = ctypes.c_char_p
        lib.fabpool_torch_build_id.argtypes = []
        build_id = lib.fabpool_torch_build_id().decode()
    except AttributeError:
        build_id = "none"
    return lib.fabpool_torch_version().decode(), build_id


def _check_build(lib, p):
    """Refuses a library of another build than this module's (a configured module only)."""
    if not _CONFIGURED:
        return
    have = _library_build(lib)
    if have != _BUILT_WITH:
        raise FabpoolError(
            "fabpool_torch: %s is fabpool %s, build %s, but this module (%s) is fabpool %s, build %s: the module "
            "and its library must come from one build. Use the library installed with the module (pass no path, "
            "unset FABPOOL_TORCH_LIBRARY and FABPOOL_TORCH_CXX_LIBRARY), or import the fabpool_torch.py that lies "
            "beside that library" % (p, have[0], have[1], os.path.abspath(__file__), _BUILT_WITH[0], _BUILT_WITH[1]))


def _sim_driver():
    """The simulated driver shipped with this module, or None: the wheel's fabpool_torch/sim/libcuda.so.1, an
    install's <libdir>/fabpool/sim/libcuda.so.1 (cmake --install --component sim), a build folder's sim/."""
    here = os.path.dirname(os.path.abspath(__file__))
    for p in (os.path.join(here, "sim", "libcuda.so.1"), os.path.join(here, "..", "..", "sim", "libcuda.so.1")):
        if os.path.isfile(p):
            return os.path.normpath(p)
    return None


def build_info():
    """{"version", "build_id"}: this module's build ("build_id" None for the
    module of the source tree, which checks nothing); "cxx_allocator": whether
    this build made the C++ allocator and it lies beside the module (None for
    the module of the source tree, which cannot say), "cxx_built_for": the
    PyTorch version it was built for (None without it: a build or wheel of the
    pluggable shim only); "sim_driver": the simulated driver that came with the
    module (the wheel's, an install's, a build's), for FABPOOL_CUDA_LIBRARY
    where there is no GPU, or None; and once a library is loaded, its "library"
    path, "library_version" and "library_build_id"."""
    out = {"version": _BUILT_WITH[0] if _CONFIGURED else None, "build_id": _BUILT_WITH[1] if _CONFIGURED else None}
    if _CONFIGURED:
        here = os.path.dirname(os.path.abspath(__file__))
        built = bool(_CXX_BUILT_FOR)
        out["cxx_allocator"] = built and os.path.isfile(os.path.join(here, _CXX_LIB_NAME))
        out["cxx_built_for"] = _CXX_BUILT_FOR if built else None
    else:
        out["cxx_allocator"] = out["cxx_built_for"] = None
    out["sim_driver"] = _sim_driver()
    if _lib is not None:
        out["library"] = _lib_path
        out["library_version"], out["library_build_id"] = _library_build(_lib)
    return out


def __getattr__(name):
    if name == "__version__":   # the module of the source tree: the version of the library it loads
        return _library_build(load())[0]
    raise AttributeError("module 'fabpool_torch' has no attribute %r" % name)


def _use(lib, p):
    """lib (the shim's, or the C++ allocator's: both have the shim's C
    functions) becomes the one this module's functions call, once
    _check_build has accepted it."""
    global _lib, _lib_path, _tags_ready
    _check_build(lib, p)
    _make_structs(lib, p)
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
    lib.fabpool_torch_get_memory_stats.restype = ctypes.c_int
    lib.fabpool_torch_get_memory_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_MemStats)]
    lib.fabpool_torch_reset_peak_stats.restype = ctypes.c_int
    lib.fabpool_torch_reset_peak_stats.argtypes = [ctypes.c_int]
    lib.fabpool_torch_reset_accumulated_stats.restype = ctypes.c_int
    lib.fabpool_torch_reset_accumulated_stats.argtypes = [ctypes.c_int]
    _lib, _lib_path, _tags_ready = lib, p, False
    return lib


def last_error():
    """The calling thread's message for its last failed call."""
    return load().fabpool_torch_last_error().decode(errors="replace")


def _check(status, what):
    if status != 0:
        raise FabpoolError("%s failed (status %d): %s" % (what, status, last_error()))


def _pluggable_allocator(path=None):
    """This library as a torch.cuda.memory.CUDAPluggableAllocator (made once)."""
    global _pluggable
    import torch
    load(path)
    if _pluggable is None:
        # CUDAPluggableAllocator opens the same file with ctypes (the same
        # handle) and hands PyTorch the two function pointers.
        # fabpool_torch_alloc_raising: an allocation that fails raises (RuntimeError, "CUDA out of memory. ...")
        # where PyTorch would take fabpool_torch_alloc's NULL as memory
        _pluggable = torch.cuda.memory.CUDAPluggableAllocator(_lib_path, "fabpool_torch_alloc_raising",
                                                              "fabpool_torch_free")
    return _pluggable


def cxx_library_path(path=None):
    """The libfabpool_torch_cxx.so that install() would use, or None: from
    $FABPOOL_TORCH_CXX_LIBRARY, beside the shim's library (`path` or
    $FABPOOL_TORCH_LIBRARY), beside this file."""
    env = os.environ.get("FABPOOL_TORCH_CXX_LIBRARY")
    if env:
        return os.path.abspath(env) if os.path.isfile(env) else None
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [os.path.dirname(os.path.abspath(x)) for x in (path, os.environ.get("FABPOOL_TORCH_LIBRARY")) if x]
    for d in dirs + [here, os.path.join(here, "lib")]:
        c = os.path.join(d, _CXX_LIB_NAME)
        if os.path.isfile(c):
            return c
    return None


def _load_cxx(torch, path):
    """(the C++ allocator's library, its path) or (None, why it cannot be used)."""
    p = cxx_library_path(path)
    if p is None:
        return None, ("%s was not found: fabpool's CMake builds it where python3 imports torch (option "
                      "FABPOOL_TORCH_CXX); set FABPOOL_TORCH_CXX_LIBRARY to its path" % _CXX_LIB_NAME)
    try:
        lib = ctypes.CDLL(p)
        lib.fabpool_torch_cxx_built_for.restype = ctypes.c_char_p
        lib.fabpool_torch_cxx_built_for.argtypes = []
        built = lib.fabpool_torch_cxx_built_for().decode()
    except (OSError, AttributeError) as e:
        return None, "%s cannot be loaded with this PyTorch (%s): rebuild fabpool against it" % (p, e)
    if built != torch.__version__:
        return None, ("%s was built against PyTorch %s, and this is PyTorch %s: rebuild fabpool against it" %
                      (p, built, torch.__version__))
    _check_build(lib, p)   # before it becomes PyTorch's allocator
    lib.fabpool_torch_cxx_install.restype = ctypes.c_int
    lib.fabpool_torch_cxx_install.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.fabpool_torch_cxx_installed.restype = ctypes.c_int
    lib.fabpool_torch_cxx_installed.argtypes = []
    lib.fabpool_torch_cxx_cpp_view.restype = ctypes.c_int
    lib.fabpool_torch_cxx_cpp_view.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.c_char_p,
                                               ctypes.c_size_t]
    return lib, p


def _warn_fallback(why):
    global _fallback_warned
    if _fallback_warned:
        return
    _fallback_warned = True
    import warnings
    warnings.warn("fabpool_torch.install(): fabpool's C++ allocator cannot be used (%s), so fabpool is installed "
                  "through PyTorch's pluggable allocator, which keeps less of PyTorch's contract:\n  - %s" %
                  (why, "\n  - ".join(SHIM_LIMITS)), RuntimeWarning, stacklevel=3)


def install(path=None, stats=False, mode=None):
    """Makes fabpool PyTorch's CUDA allocator.  Call it before any CUDA tensor
    is made (PyTorch refuses to swap an allocator that has been used).

    mode (default $FABPOOL_TORCH_MODE, else "auto"): "auto" installs the C++
    allocator where its library loads and was built against this PyTorch,
    else the pluggable shim, with one warning that names what does not work
    then; "cxx" the C++ allocator or an error; "shim" the pluggable shim.

    With the shim, stats=True also makes torch.cuda.memory_stats,
    memory_allocated, max_memory_allocated, memory_reserved,
    max_memory_reserved, reset_peak_memory_stats,
    reset_accumulated_memory_stats, memory_summary and empty_cache answer
    from fabpool (patch_torch_stats()): with a pluggable allocator PyTorch's
    own raise "CUDAPluggableAllocator does not yet support getDeviceStats"
    (empty_cache does nothing).  The C++ allocator needs no patch.
    Returns the path of the library that serves PyTorch."""
    global _allocator
    import torch
    if _allocator is None:
        mode = mode or os.environ.get("FABPOOL_TORCH_MODE") or "auto"
        if mode not in ("auto", "cxx", "shim"):
            raise FabpoolError("fabpool_torch.install(mode=%r): the mode is auto, cxx or shim" % (mode,))
        why = None
        if mode != "shim":
            lib, where = _load_cxx(torch, path)
            if lib is not None:
                msg = ctypes.create_string_buffer(1024)
                if lib.fabpool_torch_cxx_install(msg, len(msg)) != 0:
                    raise FabpoolError("fabpool_torch.install(): %s" % msg.value.decode(errors="replace"))
                _use(lib, where)
                _allocator = "cxx"
            elif mode == "cxx":
                raise FabpoolError("fabpool_torch.install(mode='cxx'): %s" % where)
            else:
                why = where
        if _allocator is None:
            if mode == "auto":
                _warn_fallback(why)
            alloc = _pluggable_allocator(path)
            try:
                torch.cuda.memory.change_current_allocator(alloc)
            except RuntimeError as e:
                raise FabpoolError("fabpool_torch.install(): PyTorch refused the allocator (%s); call install() "
                                   "before the first CUDA tensor or CUDA call that allocates" % e) from None
            _allocator = alloc
    if stats:
        patch_torch_stats(torch)
    return _lib_path


def installed():
    """What install() made PyTorch's allocator: "cxx" (the C++ allocator),
    "shim" (the pluggable shim) or None."""
    if _allocator is None:
        return None
    return "cxx" if _allocator == "cxx" else "shim"


def cpp_view(device=0):
    """What C++ callers of PyTorch's allocator API see, with the C++ allocator
    installed: {"allocated": CUDACachingAllocator::getDeviceStats(device)'s
    allocated_bytes, "reserved": its reserved_bytes, "accelerator_allocated":
    the same through c10::getDeviceAllocator(kCUDA), "get_allocator_is_fabpool":
    c10::GetAllocator(kCUDA) is fabpool's, "name_is_fabpool"}."""
    if _allocator != "cxx":
        raise FabpoolError("fabpool_torch.cpp_view(): the C++ allocator is not installed")
    out = (ctypes.c_int64 * 5)()
    msg = ctypes.create_string_buffer(512)
    if _lib.fabpool_torch_cxx_cpp_view(int(device), out, msg, len(msg)) != 0:
        raise FabpoolError("fabpool_torch.cpp_view(): %s" % msg.value.decode(errors="replace"))
    return {"allocated": out[0], "reserved": out[1], "accelerator_allocated": out[2],
            "get_allocator_is_fabpool": bool(out[3]), "name_is_fabpool": bool(out[4])}


def mempool(device=None, path=None, tag=None):
    """A torch.cuda.MemPool whose memory comes from fabpool, for

        with torch.cuda.use_mem_pool(pool):
            ...

    while PyTorch's own allocator stays the program's allocator (with all
    its statistics).  PyTorch's caching allocator still manages the pool: it
    asks fabpool for segments (2 MiB for small tensors, 20 MiB or the size
    rounded to 2 MiB for large ones), splits them into tensors and caches
    them; torch.cuda.memory_stats() counts them as usual, and
    fabpool_torch.memory_stats() counts the segments.  The pool belongs to
    `device` (default: the current one), as a MemPool belongs to the device
    current when it is made; use it on that device.  Its segments go back to
    fabpool when the pool is deleted and torch.cuda.empty_cache() runs; then
    fabpool_torch.empty() returns them to the driver.

    tag="name" gives the MemPool a fabpool pool of its own, the tag's, which
    fabpool_torch.sleep(tags=...) / wake(...) put to sleep and wake (one pool
    per tag and device, up to 8; the same tag again shares its pool)."""
    import torch
    if tag is not None:
        return _tag_mempool(tag, device, path)
    if _allocator is not None:
        raise FabpoolError("fabpool_torch.mempool(): install() already made fabpool PyTorch's allocator, so every "
                           "allocation is fabpool's; a MemPool is for programs that keep PyTorch's allocator")
    alloc = _pluggable_allocator(path)
    idx = _device_index(device)
    if idx < 0 or idx >= torch.cuda.device_count():
        raise FabpoolError("fabpool_torch.mempool(): device %d does not exist (%d CUDA devices)" %
                           (idx, torch.cuda.device_count()))
    with torch.cuda.device(idx):
        return torch.cuda.MemPool(alloc.allocator())


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
    lib = load()
    c = Counters()
    _check(lib.fabpool_torch_get_counters(device, ctypes.byref(c)), "fabpool_torch_get_counters")
    return c.as_dict()


def empty(device=-1):
    """Returns every cached block to the driver, once the work on its stream is
    done; -1: every device.  With the C++ allocator this is
    torch.cuda.empty_cache() (every device, CUDA graphs' released pools too);
    with the shim, which torch.cuda.empty_cache() does not reach, the shim's
    pools."""
    if _allocator == "cxx":
        import torch
        torch.cuda.empty_cache()
        return
    _check(load().fabpool_torch_empty(device), "fabpool_torch_empty(%d)" % device)


def shutdown():
    """Empties and destroys every pool, the devices' and the tags' (all tensors
    must be freed first: a pool with live blocks stays, and the error names
    it).  A MemPool made before must not be used after; mempool() makes a
    new one."""
    try:
        _check(load().fabpool_torch_shutdown(), "fabpool_torch_shutdown")
    finally:
        # a destroyed tag's slot is unbound: its allocator pair is not the tag's any more
        for tag, idx in list(_tag_allocators):
            if tag not in tags(idx):
                del _tag_allocators[(tag, idx)]


# ---------------------------------------------------------------- statistics

_POOLS = ("all", "small_pool", "large_pool")
_STAT_FIELDS = ("current", "peak", "allocated", "freed")


def _device_index(device):
    """A CUDA device index from None (the current device), an int, "cuda",
    "cuda:N" or a torch.device."""
    if device is None:
        torch = sys.modules.get("torch")
        try:
            if torch is not None and torch.cuda.is_initialized():
                return torch.cuda.current_device()
        except (AttributeError, RuntimeError):
            pass
        return 0
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        kind, _, idx = device.partition(":")
        if kind != "cuda":
            raise ValueError("fabpool_torch: %r is not a CUDA device" % device)
        return int(idx) if idx else _device_index(None)
    kind, idx = getattr(device, "type", None), getattr(device, "index", None)
    if kind is not None and kind != "cuda":
        raise ValueError("fabpool_torch: %r is not a CUDA device" % (device,))
    return _device_index(None) if idx is None else int(idx)


def _raw_memory_stats(device):
    lib = load()
    m = _MemStats()
    idx = _device_index(device)
    _check(lib.fabpool_torch_get_memory_stats(idx, ctypes.byref(m)), "fabpool_torch_get_memory_stats(%d)" % idx)
    return m


def memory_stats_as_nested_dict(device=None):
    """torch.cuda.memory_stats_as_nested_dict(), from fabpool's shim (with the
    C++ allocator installed: PyTorch's own, which the allocator answers).

    With PyTorch's meanings: "allocation" / "active" count the blocks handed
    to PyTorch and not freed, "allocated_bytes" / "active_bytes" their block
    sizes (fabpool's size classes), "requested_bytes" the sizes asked;
    "small_pool" / "large_pool" split them at 1 MiB asked, as PyTorch does.
    "reserved_bytes" is what fabpool has mapped for the device (all the
    driver holds for it) and "segment" its chunks; fabpool does not split
    them by PyTorch's pools, so only their "all" is filled.  Blocks are never
    split, so "inactive_split*" and "oversize_*" are 0; "num_device_alloc" /
    "num_device_free" count chunks mapped / unmapped."""
    if _allocator == "cxx":
        import torch
        return torch.cuda.memory.memory_stats_as_nested_dict(device)
    m = _raw_memory_stats(device)

    def stat(st):
        return {f: int(getattr(st, f)) for f in _STAT_FIELDS}

    def zero():
        return {f: 0 for f in _STAT_FIELDS}

    def per_pool(arr):
        return {name: stat(arr[i]) for i, name in enumerate(_POOLS)}

    def all_only(st):
        return {"all": stat(st), "small_pool": zero(), "large_pool": zero()}

    return {
        "num_alloc_retries": int(m.num_alloc_retries),
        "num_ooms": int(m.num_ooms),
        "max_split_size": -1,
        "num_sync_all_streams": int(m.num_sync_all_streams),
        "num_device_alloc": int(m.num_device_alloc),
        "num_device_free": int(m.num_device_free),
        "allocation": per_pool(m.allocation),
        "active": per_pool(m.allocation),
        "allocated_bytes": per_pool(m.allocated_bytes),
        "active_bytes": per_pool(m.allocated_bytes),
        "requested_bytes": per_pool(m.requested_bytes),
        "reserved_bytes": all_only(m.reserved_bytes),
        "segment": all_only(m.segment),
        "inactive_split": {name: zero() for name in _POOLS},
        "inactive_split_bytes": {name: zero() for name in _POOLS},
        "oversize_allocations": zero(),
        "oversize_segments": zero(),
    }


def memory_stats(device=None):
    """torch.cuda.memory_stats(), from fabpool's shim: the same flat keys
    ("allocated_bytes.all.current", "reserved_bytes.all.peak", "num_ooms",
    ...), sorted, as an OrderedDict.  Works without torch (ctypes only).
    With the C++ allocator installed: torch.cuda.memory_stats(device)."""
    if _allocator == "cxx":
        import torch
        return torch.cuda.memory.memory_stats(device)
    flat = []

    def walk(prefix, obj):
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(prefix + "." + k if prefix else k, v)
        else:
            flat.append((prefix, obj))

    walk("", memory_stats_as_nested_dict(device))
    flat.sort()
    return collections.OrderedDict(flat)


def memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None):
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None):
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None):
    """Every peak to its current value (torch.cuda.reset_peak_memory_stats)."""
    if _allocator == "cxx":
        import torch
        return torch.cuda.memory.reset_peak_memory_stats(device)
    idx = _device_index(device)
    _check(load().fabpool_torch_reset_peak_stats(idx), "fabpool_torch_reset_peak_stats(%d)" % idx)


def reset_accumulated_memory_stats(device=None):
    """The "allocated" / "freed" totals and the num_* counts to 0."""
    if _allocator == "cxx":
        import torch
        return torch.cuda.memory.reset_accumulated_memory_stats(device)
    idx = _device_index(device)
    _check(load().fabpool_torch_reset_accumulated_stats(idx), "fabpool_torch_reset_accumulated_stats(%d)" % idx)


def _empty_cache():
    empty(-1)


# torch.cuda.memory's functions that patch_torch_stats replaces.  PyTorch's
# memory_summary reads memory_stats from its module, so it needs no
# replacement once memory_stats is replaced there (it is checked by the
# tests: every key it reads is in memory_stats()).
_REPLACEMENTS = {
    "memory_stats": memory_stats,
    "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
    "memory_allocated": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "memory_reserved": memory_reserved,
    "max_memory_reserved": max_memory_reserved,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_max_memory_allocated": reset_peak_memory_stats,
    "reset_max_memory_cached": reset_peak_memory_stats,
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    "empty_cache": _empty_cache,
}


def patch_torch_stats(torch=None):
    """Makes torch.cuda's memory statistics (and torch.accelerator's, where
    they exist) answer from fabpool: each function named in _REPLACEMENTS is
    replaced in torch.cuda.memory and in torch.cuda (and in torch.accelerator
    and torch.accelerator.memory).  Code that copied a function before this
    call (`from torch.cuda import memory_allocated`) keeps PyTorch's.
    Idempotent; unpatch_torch_stats() undoes it.  With the C++ allocator
    installed it does nothing: PyTorch's own functions answer from fabpool."""
    if _allocator == "cxx":
        return
    if torch is None:
        import torch
    load()
    mods = [getattr(torch.cuda, "memory", None), torch.cuda]
    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        mods += [getattr(acc, "memory", None), acc]
    for mod in mods:
        if mod is None:
            continue
        for name, fn in _REPLACEMENTS.items():
            if not hasattr(mod, name):
                continue
            key = (mod.__name__, name)
            if key not in _patched:
                _patched[key] = (mod, getattr(mod, name))
            setattr(mod, name, fn)


def unpatch_torch_stats():
    """Puts back PyTorch's functions that patch_torch_stats replaced."""
    for (_, name), (mod, fn) in list(_patched.items()):
        setattr(mod, name, fn)
    _patched.clear()


# ---------------------------------------------------------------- tags: sleep and wake
#
# A tag is a fabpool pool: "default" is the installed allocator's
# (fabpool_torch_pool), every other tag the pool behind the MemPools made
# with mempool(tag=...).  sleep() gives a tag's device memory back to the
# driver, its bytes copied to pinned host memory first (offload) or dropped;
# wake() maps fresh memory at the same addresses and copies the bytes back:
# every tensor keeps its data_ptr.  The GPU work of the device is waited for
# first.  While a tag sleeps, allocating from it fails (PyTorch reports an
# out-of-memory error): do not run work that allocates from it.


_tags_ready = False
_tag_allocators = {}   # (tag, device) -> CUDAPluggableAllocator, kept alive with its MemPools


def _tags_lib(path=None):
    global _tags_ready
    lib = load(path)
    if not _tags_ready:
        lib.fabpool_torch_tag_slot.restype = ctypes.c_int
        lib.fabpool_torch_tag_slot.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.fabpool_torch_tag_sleep.restype = ctypes.c_int
        lib.fabpool_torch_tag_sleep.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        lib.fabpool_torch_tag_wake.restype = ctypes.c_int
        lib.fabpool_torch_tag_wake.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p]
        lib.fabpool_torch_tag_state.restype = ctypes.c_int
        lib.fabpool_torch_tag_state.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(SleepInfo)]
        lib.fabpool_torch_tag_stats_json.restype = ctypes.c_int
        lib.fabpool_torch_tag_stats_json.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                                     ctypes.POINTER(ctypes.c_size_t)]
        lib.fabpool_torch_tag_list.restype = ctypes.c_int
        lib.fabpool_torch_tag_list.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
        lib.fabpool_torch_tag_last_error.restype = ctypes.c_char_p
        lib.fabpool_torch_tag_last_error.argtypes = []
        _tags_ready = True
    return lib


def _tag_check(status, what):
    if status != 0:
        msg = _tags_lib().fabpool_torch_tag_last_error().decode(errors="replace")
        raise FabpoolError("%s failed (status %d): %s" % (what, status, msg))


def tag_slot(tag, device=0, path=None):
    """The slot (0..7) of a tag's pool on a device, its pool made on first use:
    its allocator is the pair fabpool_torch_tag<slot>_alloc / _free."""
    lib = _tags_lib(path)
    k = lib.fabpool_torch_tag_slot(tag.encode(), int(device))
    if k < 0:
        raise FabpoolError(lib.fabpool_torch_tag_last_error().decode(errors="replace"))
    return k


def _tag_mempool(tag, device, path):
    import torch
    if _allocator is not None:
        raise FabpoolError("fabpool_torch.mempool(tag=%r): install() already made fabpool PyTorch's allocator; its "
                           "pool is the tag 'default'. MemPools of other tags are for programs that keep "
                           "PyTorch's allocator" % (tag,))
    idx = _device_index(device)
    k = tag_slot(tag, idx, path)
    key = (tag, idx)
    if key not in _tag_allocators:
        _tag_allocators[key] = torch.cuda.memory.CUDAPluggableAllocator(
            _lib_path, "fabpool_torch_tag%d_alloc" % k, "fabpool_torch_tag%d_free" % k)
    with torch.cuda.device(idx):
        return torch.cuda.MemPool(_tag_allocators[key].allocator())


def tags(device=None):
    """The tags with a pool on the device ("default" once the installed allocator has allocated)."""
    lib = _tags_lib()
    buf = ctypes.create_string_buffer(4096)
    _tag_check(lib.fabpool_torch_tag_list(_device_index(device), buf, len(buf)), "fabpool_torch_tag_list")
    return [t for t in buf.value.decode().split(",") if t]


def _tag_names(tags_arg, device):
    if tags_arg is None:
        return globals()["tags"](device)
    if isinstance(tags_arg, str):
        return [tags_arg]
    return list(tags_arg)


def sleep_state(tag="default", device=None):
    """A tag's sleep state: asleep, mode, offloaded_bytes and discarded_bytes
    of its last sleep, host_bytes held now, sleeps, wakes, host_reused_bytes
    (the last sleep's host copies kept from the wake before: FABPOOL_CONF=
    sleep_keep_host:1)."""
    lib = _tags_lib()
    info = SleepInfo()
    _tag_check(lib.fabpool_torch_tag_state(tag.encode(), _device_index(device), ctypes.byref(info)),
               "fabpool_torch.sleep_state(%r)" % tag)
    return info.as_dict()


def sleep(tags=None, offload=True, device=None):
    """Puts tags to sleep (None: every tag of the device): their device
    memory goes back to the driver, every address stays reserved.
    offload: True (every tag's bytes are copied to pinned host memory and
    restored by wake), False (dropped: the tensors' contents are undefined
    after wake), or a set of the tags to offload (the others are dropped).
    Waits for the device's GPU work first.  Returns {tag: sleep_state(tag)}.
    A tag that fails raises FabpoolError; the tags before it stay asleep, and
    so does the failing tag where the status is FABPOOL_ERR_PARTIAL (17: a
    discard that had dropped contents went on, sleep_state says asleep):
    wake completes it."""
    dev = _device_index(device)
    names = _tag_names(tags, dev)
    if isinstance(offload, bool):
        keep = set(names) if offload else set()
    else:
        keep = set([offload] if isinstance(offload, str) else offload)
        unknown = keep - set(names)
        if unknown:
            raise FabpoolError("fabpool_torch.sleep(): offload names tags not put to sleep: %s" % sorted(unknown))
    lib = _tags_lib()
    out = {}
    for t in names:
        _tag_check(lib.fabpool_torch_tag_sleep(t.encode(), dev, 1 if t in keep else 0, None),
                   "fabpool_torch.sleep(tag %r, %s)" % (t, "offload" if t in keep else "discard"))
        out[t] = sleep_state(t, dev)
    return out


def wake(tags=None, device=None):
    """Wakes tags (None: every sleeping tag of the device): fresh memory at
    the same addresses, offloaded bytes restored.  Returns {tag: sleep_state(tag)}."""
    dev = _device_index(device)
    names = _tag_names(tags, dev)
    if tags is None:
        names = [t for t in names if sleep_state(t, dev)["asleep"]]
    lib = _tags_lib()
    out = {}
    for t in names:
        _tag_check(lib.fabpool_torch_tag_wake(t.encode(), dev, None), "fabpool_torch.wake(tag %r)" % t)
        out[t] = sleep_state(t, dev)
    return out


def tag_stats(tag="default", device=None):
    """fabpool's stats of a tag's pool, as a dict (mapped_bytes and the rest)."""
    lib = _tags_lib()
    need = ctypes.c_size_t(0)
    st = lib.fabpool_torch_tag_stats_json(tag.encode(), _device_index(device), None, 0, ctypes.byref(need))
    if st not in (0, 10):
        _tag_check(st, "fabpool_torch.tag_stats(%r)" % tag)
    buf = ctypes.create_string_buffer(need.value + 256)
    _tag_check(lib.fabpool_torch_tag_stats_json(tag.encode(), _device_index(device), buf, len(buf),
                                                ctypes.byref(need)), "fabpool_torch.tag_stats(%r)" % tag)
    return json.loads(buf.value.decode())


def _report_at_exit():
    """The pools' reports on stderr at exit where FABPOOL_CONF=stats_print:text|json asks for them (as
    fabpool_destroy prints them: PyTorch never destroys its allocator's pools)."""
    report = getattr(_lib, "fabpool_torch_print_stats_at_exit", None) if _lib is not None else None
    if report is not None:   # a library that lacks it (the C++ allocator's, another build) prints nothing
        report.restype = None
        report.argtypes = []
        report()


atexit.register(_report_at_exit)


# ------------------------------------------------------------------ memory over time (docs/memory-viz.md)

_history_trace = None   # the trace record_memory_history() started for the shim's pools


def _trace_path_now(path):
    """A trace path as the pools write it: %p the process id, %h the host name up to its first dot, %d device 0
    (the first pool's), %% a %."""
    out, i = [], 0
    while i < len(path):
        c = path[i]
        if c == "%" and i + 1 < len(path) and path[i + 1] in "phd%":
            k = path[i + 1]
            out.append(str(os.getpid()) if k == "p" else os.uname().nodename.split(".")[0] if k == "h" else
                       "0" if k == "d" else "%")
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def record_memory_history(path=None, max_entries=100000):
    """Starts recording every allocation and free of the process, for
    dump_snapshot() and PyTorch's memory viewer (torch.cuda._memory_viz,
    https://pytorch.org/memory_viz).

    With the C++ allocator (install() in mode "auto" or "cxx") this is
    torch.cuda.memory._record_memory_history(max_entries=max_entries), with
    the Python stacks, at any time.  With the pluggable shim, whose interface
    has no history, the shim's pools record a fabpool trace (FABPOOL_TRACE)
    into path (default: fabpool-<pid>.trace in a new private folder under
    the temporary folder, a name no other user can take first; a
    FABPOOL_TRACE set already wins), which a pool opens when it is made: call
    it before the first CUDA tensor.  Returns the trace's path (None with the
    C++ allocator)."""
    global _history_trace
    if _allocator == "cxx":
        import torch
        torch.cuda.memory._record_memory_history(max_entries=max_entries)
        return None
    env = os.environ.get("FABPOOL_TRACE")
    if env:
        _history_trace = _trace_path_now(env)
        return _history_trace
    lib = load()
    lib.fabpool_torch_pool.restype = ctypes.c_void_p
    lib.fabpool_torch_pool.argtypes = [ctypes.c_int]
    made = [d for d in range(64) if lib.fabpool_torch_pool(d)]
    if made:
        raise FabpoolError("fabpool_torch.record_memory_history(): the pools of device(s) %s were made before it "
                           "and record no trace; call it before the first CUDA tensor (or set FABPOOL_TRACE before "
                           "the program starts)" % made)
    if path is None:
        import tempfile
        path = os.path.join(tempfile.mkdtemp(prefix="fabpool-trace-"), "fabpool-%d.trace" % os.getpid())
    os.environ["FABPOOL_TRACE"] = path.replace("%", "%%")
    _history_trace = path
    return path


def dump_snapshot(path):
    """Writes the memory snapshot of the run so far into path: a pickle, as
    torch.cuda.memory._dump_snapshot writes, that
    `python -m torch.cuda._memory_viz trace_plot PATH -o out.html` (or
    https://pytorch.org/memory_viz) draws.  With the C++ allocator this is
    torch.cuda.memory._dump_snapshot(path).  With the shim: the trace
    record_memory_history() started (the first pool's: device 0 where it
    allocates first), written out so far and converted as
    `fabpool_trace --memory-snapshot` converts it (no stacks: a trace has
    none).  Returns path."""
    if _allocator == "cxx":
        import torch
        torch.cuda.memory._dump_snapshot(path)
        return path
    trace = _history_trace or (_trace_path_now(os.environ["FABPOOL_TRACE"]) if os.environ.get("FABPOOL_TRACE")
                               else None)
    if not trace:
        raise FabpoolError("fabpool_torch.dump_snapshot(%r): nothing is recorded; call "
                           "fabpool_torch.record_memory_history() before the first CUDA tensor" % (path,))
    lib = load()
    fn = getattr(lib, "fabpool_torch_memory_snapshot", None)
    if fn is None:
        raise FabpoolError("fabpool_torch.dump_snapshot(): %s has no fabpool_torch_memory_snapshot (an older "
                           "build)" % _lib_path)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    msg = ctypes.create_string_buffer(1024)
    if fn(os.fsencode(trace), os.fsencode(path), msg, len(msg)) != 0:
        raise FabpoolError("fabpool_torch.dump_snapshot(%r): %s" % (path, msg.value.decode(errors="replace")))
    return path


from fabpool_symm import SymmetricBuffer, SymmetricMemory, SymmetricMemoryError  # noqa: E402,F401 (fabpool_symm.py)

"""Host copies of device memory through a pinned staging ring, shared by
fabpool_memory_saver (torch_memory_saver's pause / resume) and fabpool_cumem
(vLLM's sleep / wake_up with offload).

The host copies are pageable: an anonymous mapping per block
(fabpool_torch_stage_host_map, advised for huge pages), given back with
munmap once its bytes are restored, so that the process's resident memory
returns to its level and no offload pays for pinning or unpinning gigabytes.
The copies go through a small pinned staging ring per device (stage_copy.c in
libfabpool_torch.so): lanes (threads, FABPOOL_STAGE_LANES, default the CPUs
the process may run on, at most 16) each with a stream and two pinned buffers
(FABPOOL_STAGE_MIB, default 16 / lanes MiB, at least 1), the DMA of one
buffer overlapping the memcpy out of (or into) the other; a lane faults the
fresh host pages of its next fill in (MADV_POPULATE_WRITE) while it waits for
that fill's DMA.  docs/rl-serving.md, "How the offload works".

The rings are the process's, one per device, whichever module copies: a ring
(2 x lanes x MiB: 32 MiB up to 16 lanes) is pinned at the first copy on its
device and held while any user (a Stage: each module's backend is one) still
has copies to restore through it.  A user says it has none left with
release_staging(); the rings are unpinned when no user has.

Without torch the module imports; Stage needs torch and fabpool_torch.
"""
import os
import threading
import weakref

__all__ = ["Stage", "stage_config", "env_bool"]


def env_bool(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _cpus():
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def stage_config():
    """(lanes, MiB per buffer) of a staging ring: FABPOOL_STAGE_LANES (1..16; default the CPUs the process may
    run on, at most 16) and FABPOOL_STAGE_MIB (1..1024; default 16 / lanes, at least 1: a ring of 32 MiB up to
    16 lanes); the ring pins 2 * lanes * MiB.  Small buffers on many lanes: on an H100 host (16 CPUs, 3 GiB into
    fresh pages) 16 lanes of 1 MiB copied 22.8 GB/s where 16 lanes of 4 MiB copied 15.5 (perf/h200/stage_probe.c;
    docs/rl-serving.md), and pinning a quarter of the ring costs a quarter of its time."""
    def num(name, default, lo, hi):
        v = os.environ.get(name, "").strip()
        if not v:
            return default
        try:
            n = int(v)
        except ValueError:
            n = None
        if n is None or not lo <= n <= hi:
            raise ValueError("%s=%r: give a whole number from %d to %d" % (name, v, lo, hi))
        return n
    lanes = num("FABPOOL_STAGE_LANES", min(16, _cpus()), 1, 16)
    return lanes, num("FABPOOL_STAGE_MIB", max(1, 16 // lanes), 1, 1024)


def _stage_types():
    import ctypes

    class StageDriver(ctypes.Structure):
        entry_points = (("mem_host_alloc", "cuMemHostAlloc"), ("mem_free_host", "cuMemFreeHost"),
                        ("device_get", "cuDeviceGet"), ("primary_ctx_retain", "cuDevicePrimaryCtxRetain"),
                        ("primary_ctx_release", "cuDevicePrimaryCtxRelease_v2"),
                        ("ctx_get_current", "cuCtxGetCurrent"), ("ctx_set_current", "cuCtxSetCurrent"),
                        ("stream_create", "cuStreamCreate"), ("stream_destroy", "cuStreamDestroy_v2"),
                        ("stream_synchronize", "cuStreamSynchronize"), ("event_create", "cuEventCreate"),
                        ("event_destroy", "cuEventDestroy_v2"), ("event_record", "cuEventRecord"),
                        ("event_synchronize", "cuEventSynchronize"),
                        ("memcpy_dtoh_async", "cuMemcpyDtoHAsync_v2"),
                        ("memcpy_htod_async", "cuMemcpyHtoDAsync_v2"))
        _fields_ = [(f, ctypes.c_void_p) for f, _ in entry_points]

    class StageItem(ctypes.Structure):
        _fields_ = [("host", ctypes.c_uint64), ("dev", ctypes.c_uint64), ("bytes", ctypes.c_uint64)]
    return StageDriver, StageItem


try:
    StageDriver, StageItem = _stage_types()   # the layouts of stage_copy.h
except ImportError:   # no ctypes: the fake backends of the tests need none
    StageDriver = StageItem = None


class _Process:
    """The process's rings and what they are loaded with.  One lock: a ring is
    neither destroyed nor made twice while a copy runs on it (stage_copy.c runs
    one copy at a time per ring)."""
    lock = threading.RLock()
    lib = None       # libfabpool_torch.so, the stage functions declared
    drv = None       # StageDriver: the driver's entry points the rings call
    rings = {}       # device -> ring, pinned at its first copy
    holders = weakref.WeakSet()   # the Stages with copies still to restore through the rings


class Stage:
    """One user's host copies and its share of the process's staging rings.
    `owner` names the module in error messages."""

    def __init__(self, torch, ft, owner):
        import ctypes
        self.torch, self.ft, self.ctypes, self._owner = torch, ft, ctypes, owner
        cuda = ctypes.CDLL(os.environ.get("FABPOOL_CUDA_LIBRARY", "libcuda.so.1"))
        for _, name in StageDriver.entry_points:
            getattr(cuda, name)   # every one the ring needs, or AttributeError now
        self.cuda = cuda

    def _fail(self, exc, err):
        return exc("%s: %s" % (self._owner, err.value.decode(errors="replace")))

    def _stage(self):
        with _Process.lock:
            if _Process.lib is None:
                ct = self.ctypes
                lib = self.ft.load()
                vp, sz, u64, cp = ct.c_void_p, ct.c_size_t, ct.c_uint64, ct.c_char_p
                for name, args, res in (
                        ("fabpool_torch_stage_create", [ct.POINTER(StageDriver), ct.c_int, ct.c_uint, sz,
                                                        ct.POINTER(vp), cp, sz], ct.c_int),
                        ("fabpool_torch_stage_destroy", [vp, cp, sz], ct.c_int),
                        ("fabpool_torch_stage_copy", [vp, vp, sz, ct.c_int, cp, sz], ct.c_int),
                        ("fabpool_torch_stage_pinned_bytes", [vp], u64),
                        ("fabpool_torch_stage_host_map", [u64, ct.POINTER(u64), cp, sz], ct.c_int),
                        ("fabpool_torch_stage_host_unmap", [u64, u64, cp, sz], ct.c_int),
                        ("fabpool_torch_stage_host_bytes", [], u64),
                        ("fabpool_torch_stage_populated_bytes", [], u64),
                        ("fabpool_torch_stage_uffd_bytes", [], u64)):
                    fn = getattr(lib, name)
                    fn.argtypes, fn.restype = args, res
                drv = StageDriver()
                for field, name in StageDriver.entry_points:
                    setattr(drv, field, ct.cast(getattr(self.cuda, name), vp).value)
                _Process.drv, _Process.lib = drv, lib
            return _Process.lib

    def _err(self):
        return self.ctypes.create_string_buffer(512)

    def _ring(self, device):
        with _Process.lock:
            ring = _Process.rings.get(device)
            if ring is None:
                lib, err, out = self._stage(), self._err(), self.ctypes.c_void_p()
                lanes, mib = stage_config()
                st = lib.fabpool_torch_stage_create(self.ctypes.byref(_Process.drv), device, lanes, mib << 20,
                                                    self.ctypes.byref(out), err, len(err))
                if st != 0:
                    raise self._fail(MemoryError, err)
                ring = _Process.rings[device] = out.value
            return ring

    def staging_bytes(self):
        """Pinned bytes of the process's staging rings held now."""
        with _Process.lock:
            if _Process.lib is None:
                return 0
            return sum(_Process.lib.fabpool_torch_stage_pinned_bytes(r) for r in _Process.rings.values())

    def release_staging(self):
        """This user has no copies left to restore: the rings are unpinned unless another user still has
        (the other module's tags asleep with host copies); the next copy pins a ring again."""
        with _Process.lock:
            _Process.holders.discard(self)
            if len(_Process.holders):
                return
            for dev in list(_Process.rings):
                err = self._err()
                if _Process.lib.fabpool_torch_stage_destroy(_Process.rings[dev], err, len(err)) != 0:
                    raise self._fail(RuntimeError, err)
                del _Process.rings[dev]

    def host_alloc(self, nbytes):
        lib, err, out = self._stage(), self._err(), self.ctypes.c_uint64()
        if lib.fabpool_torch_stage_host_map(nbytes, self.ctypes.byref(out), err, len(err)) != 0:
            raise self._fail(MemoryError, err)
        return out.value

    def host_free(self, ptr, nbytes):
        err = self._err()
        if self._stage().fabpool_torch_stage_host_unmap(ptr, nbytes, err, len(err)) != 0:
            raise self._fail(RuntimeError, err)

    def host_mapped_bytes(self):
        """Bytes of host copies mapped now by this process (every user's)."""
        return self._stage().fabpool_torch_stage_host_bytes()

    def populated_bytes(self):
        """Host bytes the copies to the host faulted in ahead of their memcpy (0: the kernel refuses it)."""
        return self._stage().fabpool_torch_stage_populated_bytes()

    def uffd_bytes(self):
        """Host bytes the copies to the host installed by UFFDIO_COPY (FABPOOL_STAGE_UFFD=1), unzeroed."""
        return self._stage().fabpool_torch_stage_uffd_bytes()

    def copy(self, device, pairs, to_host):
        """Copies each (host address, device address, bytes) one way through the device's staging ring,
        after the device's work, and returns when they are done.  The ring is then held for this user
        until its release_staging()."""
        if not pairs:
            return
        with _Process.lock:
            ring = self._ring(device)
            _Process.holders.add(self)
            self.torch.cuda.synchronize(device)
            items = (StageItem * len(pairs))(*[StageItem(h, d, n) for h, d, n in pairs])
            err = self._err()
            st = _Process.lib.fabpool_torch_stage_copy(ring, items, len(pairs), 1 if to_host else 0, err, len(err))
            if st != 0:
                raise self._fail(RuntimeError, err)

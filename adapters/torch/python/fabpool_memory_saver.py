"""torch_memory_saver's API on fabpool's tags.

A program written for torch_memory_saver changes its import and nothing else:

    from fabpool_memory_saver import torch_memory_saver     # was: from torch_memory_saver import torch_memory_saver

    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        model = Model().cuda()
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.empty(...)
    torch_memory_saver.pause("kv_cache")    # its device memory back to the driver, contents dropped
    torch_memory_saver.pause()              # every tag; "weights" copied to host memory first
    torch_memory_saver.resume()             # fresh memory at the same addresses, "weights" restored

Each (tag, enable_cpu_backup, device) of a region is a fabpool tag of its own
(fabpool_torch.mempool(tag=...)), made the first time a region names it, and
the region routes PyTorch's allocations into it with torch.cuda.use_mem_pool.
pause() sleeps the tag's fabpool pools (fabpool_torch.sleep: the device
memory is unmapped and released, every address stays reserved) and resume()
wakes them (fabpool_torch.wake).  The allocations of a region with
enable_cpu_backup=True are copied first into host memory that this module
holds, one block per pause for all the allocations that have none yet, so
that get_cpu_backup() can hand it out as a CPU tensor and retain_cpu_backup
can keep it (and its address) across resumes.

The host copies are pageable: an anonymous mapping per block (advised for
huge pages), given back with munmap when resume() is done with it, so that
the process's resident memory returns to its level and no pause pays for
pinning or unpinning gigabytes.  The copies go through a small pinned
staging ring per device (stage_copy.c in libfabpool_torch.so, driven by
fabpool_stage.py, whose rings fabpool_cumem's offload uses too): lanes
(threads, FABPOOL_STAGE_LANES, default the CPUs the process may run on, at
most 16) each with a stream and two pinned buffers (FABPOOL_STAGE_MIB,
default 16 / lanes MiB, at least 1), the DMA of one buffer overlapping the
memcpy out of (or into) the other; a lane faults the fresh host pages of its
next fill in (MADV_POPULATE_WRITE) while it waits for that fill's DMA.  The
ring (2 x lanes x MiB: 32 MiB up to 16 lanes) is pinned at a pause's first
copy and unpinned by the resume after which no tag with a CPU backup is
paused, so that host memory returns to its level after each cycle
(FABPOOL_STAGE_KEEP=1 keeps it for the process; staging_bytes(),
release_staging()) and no tag that fabpool_cumem offloaded sleeps.

What the original offers and how this module answers it:
- region(tag, enable_cpu_backup, cpu_backup_backend): as the original;
  "pinned" and "mmap" both give the staged pageable copies above (the
  memory counts in the process's resident set while it is held).
  enable_disk_backup=True is not offered (NotImplementedError).
- nested regions: the innermost region's tag and backup apply; leaving it
  returns to the enclosing one's.
- pause(tag=None) / resume(tag=None): as the original; a tag already paused
  (or already resumed) is left as it is.  While a tag is paused, allocating
  from it (a region of that tag) raises PyTorch's out-of-memory error.
- cuda_graph(graph, pool, stream, capture_error_mode, tag, enable_cpu_backup):
  torch.cuda.graph captured into the tag's pool, so that the graph's memory
  pauses with the tag (the original offers this with hook_mode "preload" only).
  Graphs captured under one tag share its pool; a `pool` argument is not
  needed for that and is refused (ValueError) unless it is the tag's own.
- disable(): allocations inside go to a plain PyTorch MemPool, deleted when it
  ends.
- get_cpu_backup(t, zero_copy=False): the host copy of a paused tensor (or of
  a retained one), None where there is none.
- retain_cpu_backup (or TMS_RETAIN_CPU_BACKUP=1): resume keeps the host copies,
  at the same addresses; the next pause refreshes them.  A copy whose
  allocation PyTorch has given back is freed at the next pause, resume or
  get_cpu_backup.
- memory_margin_bytes: resume() refuses (RuntimeError, nothing mapped) where
  the memory to map plus the margin exceeds the device's free memory.
  Allocations inside a region are not checked against it (they are fabpool's,
  made in C).
- hook_mode: "torch" only; "preload" (LD_PRELOAD of cudaMalloc) is refused
  with a ValueError, as is configure_subprocess().

Without torch the module imports and its logic runs on any backend object
with the methods of _TorchBackend (the tests use a fake one).
"""
import contextlib
import threading
import warnings

import fabpool_stage

__all__ = ["TorchMemorySaver", "torch_memory_saver", "configure_subprocess", "region", "pause", "resume",
           "cuda_graph", "disable", "get_cpu_backup", "HOOK_MODES"]

HOOK_MODES = ("torch",)
_TAG_DEFAULT = "default"
_BACKENDS = (None, "pinned", "mmap")


_env_bool = fabpool_stage.env_bool
_stage_config = fabpool_stage.stage_config


class _TorchBackend(fabpool_stage.Stage):
    """What the saver asks of PyTorch, fabpool_torch and the CUDA driver; the host copies and the staging
    ring are fabpool_stage's."""

    def __init__(self):
        import torch
        import fabpool_torch
        super().__init__(torch, fabpool_torch, "fabpool_memory_saver")

    # devices and pools
    def current_device(self):
        return self.torch.cuda.current_device()

    def mempool(self, ftag, device):
        return self.ft.mempool(device=device, tag=ftag)

    def native_mempool(self):
        return self.torch.cuda.MemPool()

    def use_mem_pool(self, pool, device):
        return self.torch.cuda.use_mem_pool(pool, device=device)

    def graph(self, graph, pool, stream, capture_error_mode):
        return self.torch.cuda.graph(graph, pool=pool.id, stream=stream, capture_error_mode=capture_error_mode)

    def pool_id(self, pool):
        return pool.id

    def segments(self, pool):
        """{address: (size, allocated bytes)} of the pool's segments."""
        return {s["address"]: (s["total_size"], s["allocated_size"]) for s in pool.snapshot()}

    def synchronize(self, device):
        self.torch.cuda.synchronize(device)

    def sleep(self, ftag, device):
        self.ft.sleep(tags=[ftag], offload=False, device=device)

    def wake(self, ftag, device):
        self.ft.wake(tags=[ftag], device=device)

    def asleep(self, ftag, device):
        return self.ft.sleep_state(ftag, device)["asleep"]

    def free_bytes(self, device):
        return self.torch.cuda.mem_get_info(device)[0]

    # tensors
    def tensor_span(self, t):
        if not t.is_cuda:
            raise ValueError("get_cpu_backup: %s is not a CUDA tensor" % (t.device,))
        if not t.is_contiguous():
            raise ValueError("get_cpu_backup: the tensor is not contiguous (shape %s, stride %s)" %
                             (tuple(t.shape), t.stride()))
        return t.data_ptr(), t.nbytes

    def cpu_tensor(self, host_ptr, like, zero_copy):
        torch = self.torch
        n = like.nbytes
        if n == 0:
            out = torch.empty(like.shape, dtype=like.dtype)
            return out
        raw = (self.ctypes.c_uint8 * n).from_address(host_ptr)
        out = torch.frombuffer(raw, dtype=torch.uint8).view(like.dtype).view(like.shape)
        return out if zero_copy else out.clone()


class _Pool:
    """One fabpool tag: the allocations of regions of one (tag, backup, device)."""

    def __init__(self, tag, backup, device, ftag, mempool):
        self.tag, self.backup, self.device, self.ftag, self.mempool = tag, backup, device, ftag, mempool
        self.paused = False
        self.copies = {}   # device address -> [host address, bytes, block]: the host copy of a segment


class _Block:
    """A host block (a pageable mapping) that holds the copies of several segments."""

    def __init__(self, ptr, size):
        self.ptr, self.size, self.users = ptr, size, 0


class TorchMemorySaver:
    """torch_memory_saver.TorchMemorySaver on fabpool (the module's docstring says what differs)."""

    def __init__(self, backend=None):
        self._backend = backend
        self._pools = {}            # (tag, backup, device) -> _Pool
        self._local = threading.local()
        self._hook_mode = "torch"
        self._retain = _env_bool("TMS_RETAIN_CPU_BACKUP")
        self._keep_ring = _env_bool("FABPOOL_STAGE_KEEP")
        self._margin = 0
        self._lock = threading.RLock()

    # ------------------------------------------------------------ configuration
    @property
    def enabled(self):
        return True

    @property
    def hook_mode(self):
        return self._hook_mode

    @hook_mode.setter
    def hook_mode(self, mode):
        if mode not in HOOK_MODES:
            raise ValueError("fabpool_memory_saver: hook_mode %r is not offered; fabpool routes a region's "
                             "allocations through PyTorch's MemPool, which is hook_mode 'torch' (no LD_PRELOAD). "
                             "Set hook_mode = 'torch' or leave it unset" % (mode,))
        self._hook_mode = mode

    @property
    def memory_margin_bytes(self):
        return self._margin

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value):
        value = int(value)
        if value < 0:
            raise ValueError("memory_margin_bytes must be >= 0, not %d" % value)
        self._margin = value

    @property
    def retain_cpu_backup(self):
        return self._retain

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value):
        self._retain = bool(value)

    def set_disk_backup_dir(self, path):
        raise NotImplementedError("fabpool_memory_saver: disk backup is not offered; use enable_cpu_backup=True "
                                  "(host memory)")

    def _be(self):
        if self._backend is None:
            self._backend = _TorchBackend()
        return self._backend

    def _stack(self):
        st = getattr(self._local, "stack", None)
        if st is None:
            st = self._local.stack = []
        return st

    def _deferred(self):
        d = getattr(self._local, "deferred", None)
        if d is None:
            d = self._local.deferred = []
        return d

    def _leave(self, st):
        """Ends this thread's innermost context; the outermost one deletes the pools disable() kept."""
        st.pop()
        if not st:
            self._local.deferred = []

    @property
    def current_region(self):
        """(tag, enable_cpu_backup) of the innermost region of this thread, or None."""
        st = self._stack()
        return st[-1] if st else None

    # ------------------------------------------------------------ regions
    @staticmethod
    def _check_region_args(tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend):
        if not isinstance(tag, str) or not tag:
            raise ValueError("region: tag must be a non-empty string, not %r" % (tag,))
        if cpu_backup_backend not in _BACKENDS:
            raise ValueError("region: cpu_backup_backend must be one of %s, not %r" % (_BACKENDS[1:],
                                                                                       cpu_backup_backend))
        if cpu_backup_backend is not None and not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if enable_disk_backup:
            if enable_cpu_backup:
                raise AssertionError("enable_cpu_backup and enable_disk_backup are mutually exclusive")
            raise NotImplementedError("fabpool_memory_saver: enable_disk_backup is not offered; use "
                                      "enable_cpu_backup=True (host memory)")

    def _pool(self, tag, backup, device):
        key = (tag, bool(backup), device)
        with self._lock:
            p = self._pools.get(key)
            if p is None:
                ftag = ("tms.b." if backup else "tms.n.") + tag
                p = self._pools[key] = _Pool(tag, bool(backup), device, ftag, self._be().mempool(ftag, device))
            return p

    @contextlib.contextmanager
    def region(self, tag=_TAG_DEFAULT, enable_cpu_backup=False, enable_disk_backup=False, cpu_backup_backend=None):
        """Allocations inside go to the tag's pool (with or without CPU backup)."""
        self._check_region_args(tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend)
        be = self._be()
        dev = be.current_device()
        pool = self._pool(tag, enable_cpu_backup, dev)
        st = self._stack()
        st.append((tag, bool(enable_cpu_backup)))
        try:
            with be.use_mem_pool(pool.mempool, dev):
                yield
        finally:
            self._leave(st)

    @contextlib.contextmanager
    def cuda_graph(self, cuda_graph, pool=None, stream=None, capture_error_mode="global", tag=_TAG_DEFAULT,
                   enable_cpu_backup=False, cpu_backup_backend=None):
        """torch.cuda.graph captured into the tag's pool: the graph's memory pauses with the tag."""
        self._check_region_args(tag, enable_cpu_backup, False, cpu_backup_backend)
        be = self._be()
        dev = be.current_device()
        p = self._pool(tag, enable_cpu_backup, dev)
        if pool is not None and tuple(pool) != tuple(be.pool_id(p.mempool)):
            raise ValueError("cuda_graph: the graph's memory comes from the pool of tag %r, which every graph "
                             "captured under that tag shares; pass pool=None" % (tag,))
        st = self._stack()
        st.append((tag, bool(enable_cpu_backup)))
        try:
            with be.graph(cuda_graph, p.mempool, stream, capture_error_mode):
                yield
        finally:
            self._leave(st)

    @contextlib.contextmanager
    def disable(self, dispose_mem_pool_after_use=True):
        """Allocations inside are PyTorch's own (a MemPool of its allocator, deleted at the end)."""
        if not dispose_mem_pool_after_use:
            raise AssertionError("Only dispose_mem_pool_after_use=true is supported now")
        be = self._be()
        dev = be.current_device()
        st = self._stack()
        st.append(None)
        try:
            native = be.native_mempool()
            with be.use_mem_pool(native, dev):
                yield
            if len(st) > 1:
                # PyTorch asserts that no pool context is open when a MemPool is deleted (its destructor
                # empties the cache, which must not run under a capture): inside a region the pool is
                # deleted when this thread's outermost context ends
                self._deferred().append(native)
            del native
        finally:
            self._leave(st)

    # ------------------------------------------------------------ pause and resume
    def _selected(self, tag):
        with self._lock:
            return [p for p in self._pools.values() if tag is None or p.tag == tag]

    def _live_segments(self, p):
        """The pool's segments now, and its host copies pruned to them."""
        segs = self._be().segments(p.mempool)
        for addr in [a for a, c in p.copies.items() if a not in segs or segs[a][0] != c[1]]:
            self._drop_copy(p, addr)
        return segs

    def _drop_copy(self, p, addr):
        c = p.copies.pop(addr)
        blk = c[2]
        blk.users -= 1
        if blk.users == 0:
            self._be().host_free(blk.ptr, blk.size)

    def _drop_copies(self, p):
        for addr in list(p.copies):
            self._drop_copy(p, addr)

    def _backup(self, p):
        """Copies the pool's allocated segments into host memory: the copies
        kept from the last resume where they are, one new block for the
        rest.  A failure drops every copy of the pool (a retained one may be
        half written) and raises; the pool is left awake, its device memory
        as it was."""
        be = self._be()
        segs = self._live_segments(p)
        want = {a: n for a, (n, used) in segs.items() if used > 0 or a in p.copies}
        new = sorted(a for a in want if a not in p.copies)
        try:
            if new:
                total = sum(want[a] for a in new)
                blk = _Block(be.host_alloc(total), total)
                at = blk.ptr
                for a in new:
                    p.copies[a] = [at, want[a], blk]
                    blk.users += 1
                    at += want[a]
            be.copy(p.device, [(p.copies[a][0], a, want[a]) for a in sorted(want)], to_host=True)
        except BaseException:
            self._drop_copies(p)
            raise

    def pause(self, tag=None):
        """Gives the device memory of the tag (None: every tag) back to the driver.
        A failure (host memory, a copy, the sleep) raises with the failing
        tag awake and its host copies freed; the tags before it stay paused.
        A sleep that fails with the pool asleep all the same (fabpool_sleep's
        FABPOOL_ERR_PARTIAL) leaves the tag paused with its copies: resume
        restores it."""
        be = self._be()
        todo = [p for p in self._selected(tag) if not p.paused]
        for dev in sorted({p.device for p in todo}):
            be.synchronize(dev)
        try:
            for p in todo:
                if p.backup:
                    self._backup(p)
                try:
                    be.sleep(p.ftag, p.device)
                except BaseException:
                    if self._slept(p):
                        p.paused = True
                    elif p.backup and not self._retain:
                        self._drop_copies(p)
                    raise
                p.paused = True
        except BaseException:
            self._settle_staging()
            raise

    def _slept(self, p):
        """Whether a sleep that raised left the pool asleep all the same
        (fabpool_sleep's FABPOOL_ERR_PARTIAL): then it is paused, its copies
        kept, for resume to complete."""
        try:
            return bool(self._be().asleep(p.ftag, p.device))
        except Exception:
            return False

    def _restore(self, p):
        """Copies the pool's host copies back after its wake.  A failed copy
        puts the pool to sleep again (paused, copies kept: the next resume
        tries again; also where that sleep raises with the pool asleep) and
        raises."""
        be = self._be()
        segs = self._live_segments(p)
        try:
            be.copy(p.device, [(c[0], a, c[1]) for a, c in sorted(p.copies.items()) if a in segs], to_host=False)
        except BaseException as e:
            try:
                be.sleep(p.ftag, p.device)
            except BaseException as e2:
                if not self._slept(p):
                    p.paused = False
                    raise RuntimeError("fabpool_memory_saver.resume: restoring tag %r failed (%s) and pausing it "
                                       "again failed too (%s): the tag is awake with part of its bytes; its host "
                                       "copies are kept (get_cpu_backup)" % (p.tag, e, e2)) from e
            raise
        p.paused = False
        if not self._retain:
            self._drop_copies(p)

    def resume(self, tag=None):
        """Maps fresh memory at the same addresses for the tag (None: every tag),
        the copies of regions with enable_cpu_backup restored."""
        be = self._be()
        todo = [p for p in self._selected(tag) if p.paused]
        if self._margin:
            for dev in sorted({p.device for p in todo}):
                need = sum(n for p in todo if p.device == dev for n, _ in be.segments(p.mempool).values())
                free = be.free_bytes(dev)
                if need + self._margin > free:
                    raise RuntimeError("fabpool_memory_saver.resume(%r): %d bytes to map on device %d with "
                                       "memory_margin_bytes %d, but %d bytes are free; nothing was resumed" %
                                       (tag, need, dev, self._margin, free))
        try:
            for p in todo:
                be.wake(p.ftag, p.device)
                if p.backup:
                    self._restore(p)
                else:
                    p.paused = False
        finally:
            self._settle_staging()

    def _settle_staging(self):
        """Unpins the staging rings once no tag with a CPU backup is paused
        (nothing left to restore through them), so that the process's host
        memory goes back to its level after a pause and resume; the next
        pause pins them again.  FABPOOL_STAGE_KEEP=1 keeps them for the
        process instead.  A ring that cannot be freed stays (a warning says
        why; release_staging() tries again)."""
        if self._keep_ring:
            return
        with self._lock:
            if any(p.paused and p.backup for p in self._pools.values()):
                return
            be = self._be()
            if not hasattr(be, "release_staging"):
                return
            try:
                be.release_staging()
            except RuntimeError as e:
                warnings.warn("fabpool_memory_saver: the staging ring stays pinned (%s); release_staging() tries "
                              "again" % (e,), RuntimeWarning, stacklevel=3)

    def get_cpu_backup(self, x, zero_copy=False):
        """The host copy of tensor x (paused, or resumed with retain_cpu_backup) as a CPU tensor of
        x's dtype and shape; None where x has none."""
        be = self._be()
        ptr, n = be.tensor_span(x)
        for p in self._selected(None):
            if not p.copies:
                continue
            self._live_segments(p)
            for a, (host, size, _) in p.copies.items():
                if a <= ptr and ptr + n <= a + size:
                    return be.cpu_tensor(host + (ptr - a), x, zero_copy)
        return None

    # ------------------------------------------------------------ what it holds
    def host_bytes(self):
        """Host memory held for copies now (pageable mappings)."""
        blocks = {id(c[2]): c[2].size for p in self._selected(None) for c in p.copies.values()}
        return sum(blocks.values())

    def staging_bytes(self):
        """Pinned host memory of the process's staging rings held now: pinned
        per device at a pause's first copy, unpinned when the last tag with a
        CPU backup resumes and no tag fabpool_cumem offloaded sleeps (kept for
        the process with FABPOOL_STAGE_KEEP=1)."""
        be = self._be()
        return be.staging_bytes() if hasattr(be, "staging_bytes") else 0

    def release_staging(self):
        """Frees the staging rings' pinned memory now (unless fabpool_cumem has tags asleep whose host copies
        it restores through them: they are freed by its last wake_up); the next copy pins a ring again."""
        with self._lock:
            be = self._be()
            if hasattr(be, "release_staging"):
                be.release_staging()

    def tags(self):
        """{tag: {"paused", "devices", "backup"}} of the tags regions have named."""
        out = {}
        for p in self._selected(None):
            d = out.setdefault(p.tag, {"paused": True, "devices": set(), "backup": set()})
            d["paused"] = d["paused"] and p.paused
            d["devices"].add(p.device)
            d["backup"].add(p.backup)
        return out


torch_memory_saver = TorchMemorySaver()


def configure_subprocess():
    """The original's LD_PRELOAD set-up for hook_mode 'preload', which fabpool does not offer."""
    raise ValueError("fabpool_memory_saver: configure_subprocess() prepares hook_mode 'preload' (LD_PRELOAD), "
                     "which fabpool does not offer; a subprocess imports this module and uses hook_mode 'torch'")


def region(tag=_TAG_DEFAULT, enable_cpu_backup=False, enable_disk_backup=False, cpu_backup_backend=None):
    return torch_memory_saver.region(tag, enable_cpu_backup, enable_disk_backup, cpu_backup_backend)


def cuda_graph(cuda_graph, pool=None, stream=None, capture_error_mode="global", tag=_TAG_DEFAULT,
               enable_cpu_backup=False, cpu_backup_backend=None):
    return torch_memory_saver.cuda_graph(cuda_graph, pool, stream, capture_error_mode, tag, enable_cpu_backup,
                                         cpu_backup_backend)


def disable():
    return torch_memory_saver.disable()


def pause(tag=None):
    torch_memory_saver.pause(tag)


def resume(tag=None):
    torch_memory_saver.resume(tag)


def get_cpu_backup(x, zero_copy=False):
    return torch_memory_saver.get_cpu_backup(x, zero_copy)

"""vLLM's CuMemAllocator (vllm.device_allocator.cumem) on fabpool's tags.

A program written for vLLM's sleep mode changes its import and nothing else:

    from fabpool_cumem import CuMemAllocator    # was: from vllm.device_allocator.cumem import CuMemAllocator

    allocator = CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        model = load_model()
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = torch.empty(...)
    allocator.sleep(offload_tags=("weights",))   # weights copied to host memory, the rest dropped
    allocator.wake_up(tags=["weights"])          # fresh memory at the same addresses, weights restored
    allocator.wake_up()                          # every tag still asleep

Each (tag, device) is a fabpool tag of its own (fabpool_torch.mempool(tag=...)),
made the first time use_memory_pool names it.  sleep() copies the segments
of the tags in offload_tags that hold allocations into pageable host memory
(one anonymous mapping per tag and device) through the pinned staging ring
of fabpool_stage.py, the one fabpool_memory_saver's pause uses, then puts
every tag to sleep with discard (fabpool_torch.sleep: the device memory is
unmapped and released, every address stays reserved).  wake_up() maps fresh
memory at the same addresses (fabpool_torch.wake), copies the offloaded bytes
back through the ring and unmaps the host copies.  The ring (32 MiB up to 16
lanes: FABPOOL_STAGE_LANES, FABPOOL_STAGE_MIB) is pinned at a sleep's first
copy and unpinned by the wake_up after which no offloaded tag sleeps
(FABPOOL_STAGE_KEEP=1 keeps it for the process), so that the process's host
memory returns to its level after each cycle and no sleep pins gigabytes.
FABPOOL_CUMEM_OFFLOAD=pinned (or CuMemAllocator.offload = "pinned") takes
the library's own offload instead: fabpool_sleep copies whole chunks into
pinned host memory of the device's NUMA node, made by each sleep.

What differs from vLLM's:
- one MemPool per (tag, device), used again by every use_memory_pool of that
  tag, where vLLM makes a new one each time: a tensor freed in one context can
  be served again to the next; nothing frees them early on leaving a context.
- sleep() on tags already asleep leaves them as they are; wake_up of a tag
  that is awake does nothing.
- a failed sleep (host memory, a copy, the sleep itself) raises with the
  failing tag awake, its device memory as it was and its host copy freed; the
  tags before it stay asleep.  A sleep that fails with the pool asleep all
  the same (fabpool_sleep's FABPOOL_ERR_PARTIAL: a discard that had dropped
  contents when the driver refused an unmap went on) raises with the tag
  asleep and its host copy kept: wake_up restores it.
- a failed wake_up (device out of memory, a failed copy back) raises
  (fabpool_torch.FabpoolError or RuntimeError); the tag stays asleep with its
  host copies kept, and a later wake_up completes it.  Where even putting it
  back to sleep fails, the tag is awake with its bytes partly restored and
  the copies kept: the next wake_up naming it copies them again.
- only segments with allocated bytes are copied: a segment PyTorch holds
  free in its cache comes back with undefined contents.
- while a tag sleeps, allocating from it raises PyTorch's out-of-memory error.
- get_current_usage() counts the bytes of the pools' segments (what PyTorch
  asked fabpool for, the same allocations vLLM counts).
- pointer_to_data is not kept (no per-allocation callback runs in Python).

Without torch the module imports and its logic runs on any backend object
with the methods of _Backend (the tests use a fake one).
"""
import contextlib
import os
import threading
import warnings

import fabpool_stage

__all__ = ["CuMemAllocator", "cumem_available", "OFFLOAD_MODES"]

cumem_available = True
OFFLOAD_MODES = ("staged", "pinned")


def _offload_mode():
    """FABPOOL_CUMEM_OFFLOAD: "staged" (the default: pageable host copies through the staging ring) or
    "pinned" (the library's offload into pinned host memory made by each sleep)."""
    v = os.environ.get("FABPOOL_CUMEM_OFFLOAD", "").strip().lower() or "staged"
    if v not in OFFLOAD_MODES:
        raise ValueError("FABPOOL_CUMEM_OFFLOAD=%r: give one of %s (or leave it unset: staged)" %
                         (os.environ.get("FABPOOL_CUMEM_OFFLOAD"), ", ".join(OFFLOAD_MODES)))
    return v


class _Backend(fabpool_stage.Stage):
    """What the allocator asks of PyTorch and fabpool_torch; the host copies and the staging ring are
    fabpool_stage's (the driver is loaded at the first use of the allocator)."""

    def __init__(self):
        import torch
        import fabpool_torch
        super().__init__(torch, fabpool_torch, "fabpool_cumem")

    def current_device(self):
        return self.torch.cuda.current_device()

    def mempool(self, ftag, device):
        return self.ft.mempool(device=device, tag=ftag)

    def use_mem_pool(self, pool, device):
        return self.torch.cuda.use_mem_pool(pool, device=device)

    def segments(self, pool):
        """{address: (size, allocated bytes)} of the pool's segments."""
        return {s["address"]: (s["total_size"], s["allocated_size"]) for s in pool.snapshot()}

    def segment_bytes(self, pool):
        return sum(s["total_size"] for s in pool.snapshot())

    def sleep(self, ftags, device, offload):
        self.ft.sleep(tags=ftags, offload=set(offload), device=device)

    def wake(self, ftags, device):
        self.ft.wake(tags=ftags, device=device)

    def asleep(self, ftag, device):
        return self.ft.sleep_state(ftag, device)["asleep"]

    def empty_cache(self):
        self.torch.cuda.empty_cache()


class _HostCopy:
    """The host copy of one (tag, device): one pageable mapping holding its offloaded segments."""

    def __init__(self, ptr, size):
        self.ptr, self.size = ptr, size
        self.segs = {}   # device address -> (host address, bytes)


class CuMemAllocator:
    """vllm.device_allocator.cumem.CuMemAllocator on fabpool (the module's docstring says what differs)."""

    instance = None
    default_tag = "default"

    @staticmethod
    def get_instance():
        if CuMemAllocator.instance is None:
            CuMemAllocator.instance = CuMemAllocator()
        return CuMemAllocator.instance

    def __init__(self, backend=None):
        self._backend = backend
        self.current_tag = CuMemAllocator.default_tag
        self._pools = {}   # (tag, device) -> (fabpool tag, MemPool)
        self._asleep = set()   # (tag, device)
        self._copies = {}   # (tag, device) -> _HostCopy: offloaded bytes not yet restored
        self._offload = _offload_mode()
        self._keep_ring = fabpool_stage.env_bool("FABPOOL_STAGE_KEEP")
        self._lock = threading.RLock()

    @property
    def offload(self):
        """How sleep() offloads: "staged" or "pinned" (FABPOOL_CUMEM_OFFLOAD; the module's docstring)."""
        return self._offload

    @offload.setter
    def offload(self, mode):
        if mode not in OFFLOAD_MODES:
            raise ValueError("CuMemAllocator.offload must be one of %s, not %r" % (OFFLOAD_MODES, mode))
        with self._lock:
            self._offload = mode

    def _be(self):
        if self._backend is None:
            self._backend = _Backend()
        return self._backend

    @staticmethod
    def _ftag(tag):
        return "vllm." + tag

    @contextlib.contextmanager
    def use_memory_pool(self, tag=None):
        """Allocations inside go to the tag's pool (None: "default")."""
        if tag is None:
            tag = CuMemAllocator.default_tag
        if not isinstance(tag, str) or not tag:
            raise ValueError("use_memory_pool: tag must be a non-empty string, not %r" % (tag,))
        be = self._be()
        dev = be.current_device()
        with self._lock:
            key = (tag, dev)
            if key not in self._pools:
                self._pools[key] = (self._ftag(tag), be.mempool(self._ftag(tag), dev))
            pool = self._pools[key][1]
        old = self.current_tag
        self.current_tag = tag
        try:
            with be.use_mem_pool(pool, dev):
                yield
        finally:
            self.current_tag = old

    @staticmethod
    def _tag_tuple(tags):
        if tags is None:
            return None
        if isinstance(tags, str):
            return (tags,)
        return tuple(tags)

    def sleep(self, offload_tags=None):
        """Every tag goes to sleep: those in offload_tags (None: ("default",)) copied to host memory and
        restored by wake_up, the others dropped.  A failure raises with the failing tag awake, its device
        memory as it was; the tags before it stay asleep."""
        offload = self._tag_tuple(offload_tags)
        if offload is None:
            offload = (CuMemAllocator.default_tag,)
        be = self._be()
        with self._lock:
            by_dev = {}
            for (tag, dev) in self._pools:
                if (tag, dev) not in self._asleep:
                    by_dev.setdefault(dev, []).append(tag)
            try:
                for dev, names in sorted(by_dev.items()):
                    if self._offload == "pinned":
                        self._sleep_pinned(dev, sorted(names), offload)
                    else:
                        for tag in sorted(names):
                            self._sleep_staged(tag, dev, tag in offload)
            finally:
                self._settle_staging()
        be.empty_cache()

    def _slept(self, tag, dev):
        """Whether a sleep that raised left the tag's pool asleep all the same (fabpool_sleep's
        FABPOOL_ERR_PARTIAL): then the tag is asleep, its host copy kept, for wake_up to complete."""
        try:
            return bool(self._be().asleep(self._ftag(tag), dev))
        except Exception:
            return False

    def _sleep_pinned(self, dev, names, offload):
        """The library's offload: fabpool_sleep copies whole chunks into pinned host memory it makes.
        One tag at a time, so that the tags put to sleep before a failure are known."""
        be = self._be()
        for tag in names:
            ftag = self._ftag(tag)
            try:
                be.sleep([ftag], dev, [ftag] if tag in offload else [])
            except BaseException:
                if self._slept(tag, dev):
                    self._asleep.add((tag, dev))
                raise
            self._asleep.add((tag, dev))

    def _sleep_staged(self, tag, dev, keep):
        """Copies the (tag, device)'s allocated segments to host memory (keep), then sleeps it with
        discard.  A failure frees the copy it made and leaves the tag awake, unless the sleep left it asleep
        all the same: then it keeps the copy, asleep."""
        be = self._be()
        key = (tag, dev)
        made = None
        if keep and key not in self._copies:
            # a tag whose earlier restore failed and could not be put back to sleep keeps that copy: it
            # holds the bytes, the device memory only part of them
            made = self._backup(key)
        try:
            be.sleep([self._ftag(tag)], dev, ())
        except BaseException:
            if self._slept(tag, dev):
                self._asleep.add(key)
            elif made is not None:
                self._drop_copy(key)
            raise
        self._asleep.add(key)

    def _backup(self, key):
        be = self._be()
        tag, dev = key
        segs = be.segments(self._pools[key][1])
        want = sorted((a, n) for a, (n, used) in segs.items() if used > 0 and n > 0)
        if not want:
            return None   # nothing allocated: nothing to restore
        total = sum(n for _, n in want)
        hc = _HostCopy(be.host_alloc(total), total)
        at = hc.ptr
        for a, n in want:
            hc.segs[a] = (at, n)
            at += n
        self._copies[key] = hc
        try:
            be.copy(dev, [(h, a, n) for a, (h, n) in sorted(hc.segs.items())], to_host=True)
        except BaseException:
            self._drop_copy(key)
            raise
        return hc

    def _drop_copy(self, key):
        hc = self._copies.pop(key)
        self._be().host_free(hc.ptr, hc.size)

    def _restore(self, key):
        """Copies the (tag, device)'s host copy back after its wake and frees it.  A failed copy puts the
        tag to sleep again (its copy kept: the next wake_up tries again; also where that sleep raises with
        the tag asleep) and raises."""
        be = self._be()
        tag, dev = key
        hc = self._copies[key]
        segs = be.segments(self._pools[key][1])
        pairs = [(h, a, n) for a, (h, n) in sorted(hc.segs.items()) if a in segs and segs[a][0] == n]
        try:
            if pairs:
                be.copy(dev, pairs, to_host=False)
        except BaseException as e:
            try:
                be.sleep([self._ftag(tag)], dev, ())
            except BaseException as e2:
                if not self._slept(tag, dev):
                    self._asleep.discard(key)
                    raise RuntimeError("fabpool_cumem.wake_up: restoring tag %r on device %d failed (%s) and "
                                       "putting it back to sleep failed too (%s): the tag is awake with its bytes "
                                       "partly restored; its host copy is kept and the next wake_up(%r) copies it "
                                       "again" % (tag, dev, e, e2, tag)) from e
            raise
        self._asleep.discard(key)
        self._drop_copy(key)

    def wake_up(self, tags=None):
        """The tags (None: all) that sleep get fresh memory at the same addresses; offloaded contents
        are restored, the others' are undefined.  A failure raises with the failing tag asleep and its
        host copy kept; the tags before it are awake."""
        want = self._tag_tuple(tags)
        be = self._be()
        with self._lock:
            try:
                for key in sorted(self._asleep | set(self._copies)):
                    tag, dev = key
                    if want is not None and tag not in want:
                        continue
                    if key in self._asleep:
                        be.wake([self._ftag(tag)], dev)
                    if key in self._copies:
                        self._restore(key)
                    else:
                        self._asleep.discard(key)
            finally:
                self._settle_staging()

    def _settle_staging(self):
        """Unpins the staging rings once no host copy is left to restore (the next sleep pins them again;
        FABPOOL_STAGE_KEEP=1 keeps them).  A ring that cannot be freed stays, with a warning."""
        if self._keep_ring or self._copies:
            return
        be = self._be()
        if not hasattr(be, "release_staging"):
            return
        try:
            be.release_staging()
        except RuntimeError as e:
            warnings.warn("fabpool_cumem: the staging ring stays pinned (%s); the next wake_up tries again" % (e,),
                          RuntimeWarning, stacklevel=3)

    def get_current_usage(self):
        """Bytes of device memory the pools hold for PyTorch (asleep or not)."""
        be = self._be()
        with self._lock:
            return sum(be.segment_bytes(pool) for _, pool in self._pools.values())

    def sleeping_tags(self):
        """The (tag, device) pairs asleep now."""
        with self._lock:
            return sorted(self._asleep)

    def host_bytes(self):
        """Host memory held now for offloaded bytes (pageable mappings; 0 with offload "pinned", whose
        copies are the library's: fabpool_torch.sleep_state)."""
        with self._lock:
            return sum(hc.size for hc in self._copies.values())

    def staging_bytes(self):
        """Pinned host memory of the process's staging rings held now."""
        be = self._be()
        return be.staging_bytes() if hasattr(be, "staging_bytes") else 0

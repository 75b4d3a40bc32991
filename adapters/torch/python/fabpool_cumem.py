"""vLLM's CuMemAllocator (vllm.device_allocator.cumem) on fabpool's tags.

A program written for vLLM's sleep mode changes its import and nothing else:

    from fabpool_cumem import CuMemAllocator    # was: from vllm.device_allocator.cumem import CuMemAllocator

    allocator = CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        model = load_model()
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = torch.empty(...)
    allocator.sleep(offload_tags=("weights",))   # weights copied to pinned host memory, the rest dropped
    allocator.wake_up(tags=["weights"])          # fresh memory at the same addresses, weights restored
    allocator.wake_up()                          # every tag still asleep

Each (tag, device) is a fabpool tag of its own (fabpool_torch.mempool(tag=...)),
made the first time use_memory_pool names it, and sleep / wake_up are
fabpool_torch.sleep (offload for the tags in offload_tags, discard for the
others) and fabpool_torch.wake: fabpool copies whole chunks to pinned host
memory of the device's NUMA node and back, and maps and unmaps chunks rather
than single allocations.

What differs from vLLM's:
- one MemPool per (tag, device), used again by every use_memory_pool of that
  tag, where vLLM makes a new one each time: a tensor freed in one context can
  be served again to the next; nothing frees them early on leaving a context.
- sleep() on tags already asleep leaves them as they are; wake_up of a tag
  that is awake does nothing.  A failed wake_up (device out of memory) raises
  fabpool_torch.FabpoolError, a RuntimeError; the tag stays asleep with what
  was restored kept, and a later wake_up completes it.
- while a tag sleeps, allocating from it raises PyTorch's out-of-memory error.
- get_current_usage() counts the bytes of the pools' segments (what PyTorch
  asked fabpool for, the same allocations vLLM counts).
- pointer_to_data is not kept (no per-allocation callback runs in Python).
"""
import contextlib
import os
import threading

__all__ = ["CuMemAllocator", "cumem_available"]

cumem_available = True


class _Backend:
    def __init__(self):
        import torch
        import fabpool_torch
        self.torch, self.ft = torch, fabpool_torch

    def current_device(self):
        return self.torch.cuda.current_device()

    def mempool(self, ftag, device):
        return self.ft.mempool(device=device, tag=ftag)

    def use_mem_pool(self, pool, device):
        return self.torch.cuda.use_mem_pool(pool, device=device)

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
        self._lock = threading.RLock()

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
        """Every tag goes to sleep: those in offload_tags (None: ("default",)) copied to pinned host
        memory and restored by wake_up, the others dropped."""
        offload = self._tag_tuple(offload_tags)
        if offload is None:
            offload = (CuMemAllocator.default_tag,)
        be = self._be()
        with self._lock:
            by_dev = {}
            for (tag, dev) in self._pools:
                if (tag, dev) not in self._asleep:
                    by_dev.setdefault(dev, []).append(tag)
            for dev, names in sorted(by_dev.items()):
                ftags = [self._ftag(t) for t in names]
                keep = [self._ftag(t) for t in names if t in offload]
                be.sleep(ftags, dev, keep)
                self._asleep.update((t, dev) for t in names)
        be.empty_cache()

    def wake_up(self, tags=None):
        """The tags (None: all) that sleep get fresh memory at the same addresses; offloaded contents
        are restored, the others' are undefined."""
        want = self._tag_tuple(tags)
        be = self._be()
        with self._lock:
            for (tag, dev) in sorted(self._asleep):
                if want is not None and tag not in want:
                    continue
                be.wake([self._ftag(tag)], dev)
                self._asleep.discard((tag, dev))

    def get_current_usage(self):
        """Bytes of device memory the pools hold for PyTorch (asleep or not)."""
        be = self._be()
        with self._lock:
            return sum(be.segment_bytes(pool) for _, pool in self._pools.values())

    def sleeping_tags(self):
        """The (tag, device) pairs asleep now."""
        with self._lock:
            return sorted(self._asleep)

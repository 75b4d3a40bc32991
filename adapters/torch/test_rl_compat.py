"""fabpool_memory_saver (torch_memory_saver's API) and fabpool_cumem (vLLM's
CuMemAllocator) on a fake backend that holds device and host memory as bytes:
regions and nesting, tag bookkeeping, what pause / sleep copies and drops,
host copies (get_cpu_backup, retained copies, freed with their allocation),
the memory margin and the refusals; vLLM's sleep / wake_up offloading
through the same staging ring, and what each failure leaves.  No torch, no library: the GPU half is
test_rl_gpu.py.  Usage: test_rl_compat.py [directory of the modules]"""
import contextlib
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "python"))
import fabpool_cumem  # noqa: E402
import fabpool_memory_saver as fms  # noqa: E402
import fabpool_stage  # noqa: E402

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAILED:", what)


def raises(exc, fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except exc as e:
        return str(e)
    return None


class Pool:
    def __init__(self, name, device, native=False):
        self.name, self.device, self.native = name, device, native
        self.id = (id(self), 0)
        self.segs = {}          # address -> bytearray
        self.freed = set()      # addresses whose tensors were freed (the segment is cached)
        self.asleep = False


class Tensor:
    def __init__(self, be, addr, n):
        self.be, self.addr, self.nbytes = be, addr, n

    def read(self):
        return bytes(self.be.seg_of(self.addr)[0][self.addr - self.be.seg_of(self.addr)[1]:][:self.nbytes])

    def write(self, data):
        seg, base = self.be.seg_of(self.addr)
        seg[self.addr - base:self.addr - base + len(data)] = data


class NativePool(Pool):
    """A MemPool of PyTorch's own allocator: deleting one while a pool context is open is what
    PyTorch asserts against (captures_underway.empty())."""

    def __init__(self, be, device):
        super().__init__("native-scoped", device, native=True)
        self.be = be

    def __del__(self):
        self.be.native_deleted.append(list(self.be.active))


class FakeBackend:
    """Device memory as bytes per segment; a pool that sleeps loses them (discard) or has them
    copied by fabpool (offload); host memory as bytes per block."""

    def __init__(self, free=1 << 40):
        self.device = 0
        self.pools = {}
        self.active = []
        self.next_addr = 1 << 32
        self.host = {}
        self.next_host = 1 << 44
        self.calls = []
        self.free = free
        self.native = Pool("native", 0, native=True)
        self.native_deleted = []   # the contexts open when each disable() pool was deleted
        self.ring_bytes = 64 << 10   # one staging buffer
        self.fills = 0               # staging buffers moved
        self.fail_fill = 0           # fails the n-th buffer of the next copy (1: the first)
        self.fail_host_alloc = False
        self.fail_sleep = False
        self.fail_sleep_tag = None   # fails the sleep of this fabpool tag, after the tags before it in the call
        self.fail_sleep_asleep = None  # the sleep of this fabpool tag raises with the pool asleep all the same
                                       # (fabpool_sleep's FABPOOL_ERR_PARTIAL), its memory gone
        self.copied = []             # (device address, to_host) of every span copied through the ring
        self.rings = {}              # device -> pinned bytes of its staging ring, made at a copy
        self.ring_pins = 0           # rings pinned so far
        self.fail_release = False

    # what the savers call
    def current_device(self):
        return self.device

    def mempool(self, ftag, device):
        p = self.pools[(ftag, device)] = Pool(ftag, device)
        return p

    def native_mempool(self):
        return NativePool(self, self.device)

    @contextlib.contextmanager
    def use_mem_pool(self, pool, device):
        self.active.append(pool)
        try:
            yield
        finally:
            self.active.pop()

    def graph(self, graph, pool, stream, capture_error_mode):
        graph.pool = pool.id
        return self.use_mem_pool(pool, self.device)

    def pool_id(self, pool):
        return pool.id

    def segments(self, pool):
        return {a: (len(s), 0 if a in pool.freed else len(s)) for a, s in pool.segs.items()}

    def segment_bytes(self, pool):
        return sum(len(s) for s in pool.segs.values())

    def synchronize(self, device):
        self.calls.append(("sync", device))

    def sleep(self, ftag, device, offload=()):
        names = ftag if isinstance(ftag, list) else [ftag]
        if self.fail_sleep:
            self.fail_sleep = False
            raise RuntimeError("fake: sleep failed")
        for n in names:
            if n == self.fail_sleep_tag:
                self.fail_sleep_tag = None
                raise RuntimeError("fake: sleep of %s failed" % n)
            p = self.pools[(n, device)]
            assert not p.asleep, "a pool put to sleep twice"
            p.asleep = True
            p.offloaded = {a: bytes(s) for a, s in p.segs.items()} if n in offload else None
            for a in p.segs:
                p.segs[a] = bytearray(b"\xee" * len(p.segs[a]))   # the memory is gone
            self.calls.append(("sleep", n, device, n in offload))
            if n == self.fail_sleep_asleep:
                self.fail_sleep_asleep = None
                raise RuntimeError("fake: the sleep of %s failed (FABPOOL_ERR_PARTIAL): the pool is asleep" % n)

    def wake(self, ftag, device):
        for n in (ftag if isinstance(ftag, list) else [ftag]):
            p = self.pools[(n, device)]
            if self.free < sum(len(s) for s in p.segs.values()):
                raise RuntimeError("out of memory")
            p.asleep = False
            for a in p.segs:
                p.segs[a] = bytearray(p.offloaded[a]) if p.offloaded else bytearray(len(p.segs[a]))
            self.calls.append(("wake", n, device))

    def asleep(self, ftag, device):
        return self.pools[(ftag, device)].asleep

    def free_bytes(self, device):
        return self.free

    def empty_cache(self):
        self.calls.append(("empty_cache",))

    def host_alloc(self, n):
        if self.fail_host_alloc:
            self.fail_host_alloc = False
            raise MemoryError("fake: no host memory")
        p = self.next_host
        self.next_host += n + 4096
        self.host[p] = bytearray(n)
        self.calls.append(("host_alloc", n))
        return p

    def host_free(self, p, n):
        assert len(self.host[p]) == n, "a host block freed with another size than it was mapped with"
        del self.host[p]
        self.calls.append(("host_free", p))

    def host_at(self, ptr):
        for base, buf in self.host.items():
            if base <= ptr < base + len(buf):
                return buf, base
        raise AssertionError("no host block at 0x%x" % ptr)

    def seg_of(self, addr):
        for p in list(self.pools.values()) + [self.native]:
            for a, s in p.segs.items():
                if a <= addr < a + len(s):
                    return s, a
        raise AssertionError("no segment at 0x%x" % addr)

    def pool_of(self, addr):
        for p in self.pools.values():
            if addr in p.segs:
                return p
        return None

    def copy(self, device, pairs, to_host):
        """As the staging ring copies: the pairs' bytes packed into buffers of ring_bytes, each buffer
        moved whole (DMA) and then spread (memcpy); fail_fill = k fails the k-th buffer's DMA of this
        call, after the ones before it were copied."""
        if device not in self.rings:
            self.rings[device] = 2 * self.ring_bytes
            self.ring_pins += 1
        staging = bytearray(self.ring_bytes)
        spans, fills, pos = [], [], 0
        for host, dev, n in pairs:
            p = self.pool_of(dev)
            assert p is not None and not p.asleep, "a copy from or to a pool that sleeps"
            off = 0
            while off < n:
                take = min(n - off, self.ring_bytes - pos)
                spans.append((host + off, dev + off, take, pos))
                pos += take
                off += take
                if pos == self.ring_bytes:
                    fills.append(spans)
                    spans, pos = [], 0
        if spans:
            fills.append(spans)
        for k, fill in enumerate(fills):
            if self.fail_fill == k + 1:
                self.fail_fill = 0
                raise RuntimeError("fake: copying through the staging ring failed (CUDA error 700)")
            for host, dev, n, at in fill:
                self.copied.append((dev, to_host))
                buf, hb = self.host_at(host)
                seg, sb = self.seg_of(dev)
                if to_host:
                    staging[at:at + n] = seg[dev - sb:dev - sb + n]
                    buf[host - hb:host - hb + n] = staging[at:at + n]
                else:
                    staging[at:at + n] = buf[host - hb:host - hb + n]
                    seg[dev - sb:dev - sb + n] = staging[at:at + n]
            self.fills += 1
        self.calls.append(("copy", device, len(pairs), to_host))

    def staging_bytes(self):
        return sum(self.rings.values())

    def release_staging(self):
        if self.fail_release:
            self.fail_release = False
            raise RuntimeError("fake: making device 0's context current failed (CUDA error 201); the ring is kept")
        self.rings.clear()

    def tensor_span(self, t):
        return t.addr, t.nbytes

    def cpu_tensor(self, host_ptr, like, zero_copy):
        buf, hb = self.host_at(host_ptr)
        return (host_ptr if zero_copy else None, bytes(buf[host_ptr - hb:host_ptr - hb + like.nbytes]))

    # what the tests do: allocate the way PyTorch's allocator would (a segment from the active pool)
    def alloc(self, n, fill):
        pool = self.active[-1] if self.active else self.native
        assert not pool.asleep, "allocating from a pool that sleeps"
        a = self.next_addr
        self.next_addr += (n + 0xfffff) & ~0xfffff
        pool.segs[a] = bytearray(fill * n if len(fill) == 1 else fill)
        return Tensor(self, a, n)

    def free_tensor(self, t, give_back=False):
        p = self.pool_of(t.addr)
        p.freed.add(t.addr)
        if give_back:
            del p.segs[t.addr]
            p.freed.discard(t.addr)


def pattern(seed, n):
    return bytes((i * 7 + seed) % 251 for i in range(n))


def saver(**kw):
    be = FakeBackend(**kw)
    return fms.TorchMemorySaver(backend=be), be


def test_regions_route_and_nest():
    tms, be = saver()
    check(tms.current_region is None, "no region outside")
    with tms.region(tag="weights", enable_cpu_backup=True):
        w = be.alloc(4096, b"w")
        check(tms.current_region == ("weights", True), "inside: weights with backup")
        with tms.region(tag="grad"):
            g = be.alloc(4096, b"g")
            check(tms.current_region == ("grad", False), "nested: the inner region's tag")
            with tms.disable():
                n = be.alloc(4096, b"n")
                check(tms.current_region is None, "disable(): no tag")
            check(be.native_deleted == [], "disable() inside a region keeps its pool while the region is open")
        check(tms.current_region == ("weights", True), "after the nested region: the outer one again")
        w2 = be.alloc(4096, b"x")
    check(tms.current_region is None, "none after the outer region")
    check(be.native_deleted == [[]], "the disable() pool deleted when the outermost region ended, no context open")
    with tms.disable():
        be.alloc(4096, b"d")
    check(be.native_deleted == [[], []], "disable() outside a region deletes its pool at its end")
    check(be.pool_of(w.addr).name == "tms.b.weights" and be.pool_of(w2.addr).name == "tms.b.weights",
          "weights in the backup pool of its tag")
    check(be.pool_of(g.addr).name == "tms.n.grad", "grad in the pool without backup")
    check(be.pool_of(n.addr) is None, "disable() allocates outside every tag")
    with tms.region(tag="weights"):
        be.alloc(4096, b"y")
    check(set(tms.tags()) == {"weights", "grad"} and tms.tags()["weights"]["backup"] == {True, False},
          "one tag, two pools: with and without backup")


def test_pause_resume_backup_and_discard():
    tms, be = saver()
    w_data, kv_data = pattern(1, 3 << 20), pattern(2, 1 << 20)
    with tms.region(tag="weights", enable_cpu_backup=True):
        w = be.alloc(len(w_data), w_data)
        w_small = be.alloc(4096, pattern(3, 4096))
    with tms.region(tag="kv_cache"):
        kv = be.alloc(len(kv_data), kv_data)
    addrs = (w.addr, kv.addr)
    tms.pause("kv_cache")
    check(be.pools[("tms.n.kv_cache", 0)].asleep and not be.pools[("tms.b.weights", 0)].asleep,
          "pause(tag) sleeps that tag only")
    check(w.read() == w_data, "the other tag keeps its bytes")
    tms.pause()
    check(be.pools[("tms.b.weights", 0)].asleep, "pause() sleeps every tag")
    check([c for c in be.calls if c[0] == "sleep" and c[1] == "tms.n.kv_cache"].__len__() == 1,
          "a paused tag is not paused twice")
    check(tms.host_bytes() == len(w_data) + 4096, "the host holds the backup pool's segments")
    check([c for c in be.calls if c[0] == "host_alloc"] == [("host_alloc", len(w_data) + 4096)],
          "one pinned block for every segment of the pause")
    got = tms.get_cpu_backup(w)
    check(got is not None and got[1] == w_data, "get_cpu_backup: the tensor's bytes while paused")
    check(tms.get_cpu_backup(kv) is None, "no backup for a tag without enable_cpu_backup")
    tms.resume("weights")
    check(w.read() == w_data and w_small.read() == pattern(3, 4096), "backup bytes restored bitwise")
    check(be.pools[("tms.n.kv_cache", 0)].asleep, "resume(tag) wakes that tag only")
    check(tms.host_bytes() == 0 and not be.host, "resume frees the host copies")
    check(tms.get_cpu_backup(w) is None, "no backup after resume")
    tms.resume()
    check(not be.pools[("tms.n.kv_cache", 0)].asleep, "resume() wakes the rest")
    check(kv.read() != kv_data, "a tag without backup comes back without its bytes")
    check((w.addr, kv.addr) == addrs, "addresses unchanged")
    n_wakes = len([c for c in be.calls if c[0] == "wake"])
    tms.resume()
    check(len([c for c in be.calls if c[0] == "wake"]) == n_wakes, "resume of awake tags does nothing")


def test_retained_copies_keep_their_address():
    tms, be = saver()
    data = pattern(5, 8192)
    with tms.region(tag="r", enable_cpu_backup=True):
        t = be.alloc(len(data), data)
    with tms.region(tag="other", enable_cpu_backup=True):
        o = be.alloc(4096, pattern(6, 4096))
    tms.pause("r")
    first = tms.get_cpu_backup(t, zero_copy=True)
    check(first[0] is not None and first[1] == data, "zero_copy: a view of the host copy")
    check(o.read() == pattern(6, 4096), "the other tag untouched")
    tms.retain_cpu_backup = True
    tms.resume("r")
    after = tms.get_cpu_backup(t, zero_copy=True)
    check(after is not None and after[0] == first[0] and after[1] == data, "retained: same host address, same bytes")
    tms.retain_cpu_backup = False
    check(tms.get_cpu_backup(t, zero_copy=True)[0] == first[0], "still there until the next resume")
    new = pattern(7, 8192)
    t.write(new)
    tms.pause("r")
    second = tms.get_cpu_backup(t, zero_copy=True)
    check(second[0] == first[0] and second[1] == new, "the next pause refreshes the retained copy in place")
    check(len([c for c in be.calls if c[0] == "host_alloc"]) == 1, "no new host memory for a retained copy")
    tms.resume("r")
    check(t.read() == new and tms.get_cpu_backup(t) is None and not be.host,
          "resume without retain: restored, then the copy freed")
    os.environ["TMS_RETAIN_CPU_BACKUP"] = "1"
    try:
        check(fms.TorchMemorySaver(backend=FakeBackend()).retain_cpu_backup is True, "TMS_RETAIN_CPU_BACKUP=1")
    finally:
        del os.environ["TMS_RETAIN_CPU_BACKUP"]


def test_copies_follow_the_allocations():
    tms, be = saver()
    tms.retain_cpu_backup = True
    with tms.region(tag="w", enable_cpu_backup=True):
        a = be.alloc(4096, pattern(1, 4096))
        b = be.alloc(4096, pattern(2, 4096))
    tms.pause()
    pa = tms.get_cpu_backup(a, zero_copy=True)[0]
    tms.resume()
    with tms.region(tag="w", enable_cpu_backup=True):
        c = be.alloc(8192, pattern(3, 8192))
    tms.pause()
    check(tms.get_cpu_backup(a, zero_copy=True)[0] == pa, "an old allocation keeps its host copy")
    check(tms.get_cpu_backup(c, zero_copy=True)[1] == pattern(3, 8192), "a new one gets a copy")
    check(len([x for x in be.calls if x[0] == "host_alloc"]) == 2, "one new block for the new allocation")
    # b freed and its segment given back while paused: its copy goes, and nothing is written to it
    be.free_tensor(b, give_back=True)
    tms.resume()
    check(a.read() == pattern(1, 4096) and c.read() == pattern(3, 8192), "the live ones restored")
    check(tms.get_cpu_backup(b) is None, "the freed allocation has no copy")
    tms.retain_cpu_backup = False
    tms.pause()
    tms.resume()
    check(not be.host, "every block freed once nothing is retained")
    # a segment PyTorch caches with nothing allocated in it is not copied
    with tms.region(tag="w", enable_cpu_backup=True):
        d = be.alloc(1 << 20, b"d")
    be.free_tensor(d)
    tms.pause()
    check(tms.host_bytes() == 4096 + 8192, "a free cached segment gets no host copy")
    tms.resume()


def test_refusals():
    tms, be = saver()
    check(raises(ValueError, setattr, tms, "hook_mode", "preload") is not None, "hook_mode preload refused")
    tms.hook_mode = "torch"
    check(tms.hook_mode == "torch", "hook_mode torch")
    check(raises(ValueError, fms.configure_subprocess) is not None, "configure_subprocess refused")
    msg = raises(ValueError, lambda: tms.region(enable_cpu_backup=False, cpu_backup_backend="mmap").__enter__())
    check(msg is not None and "requires enable_cpu_backup" in msg, "a backend without backup: the original's error")
    check(raises(NotImplementedError, lambda: tms.region(enable_disk_backup=True).__enter__()) is not None,
          "disk backup refused")
    check(raises(NotImplementedError, tms.set_disk_backup_dir, "/tmp") is not None, "set_disk_backup_dir refused")
    with tms.region(enable_cpu_backup=True, cpu_backup_backend="mmap"):
        be.alloc(4096, b"m")
    check(("tms.b.default", 0) in be.pools, "mmap: a backup pool (pinned memory)")
    check(raises(ValueError, setattr, tms, "memory_margin_bytes", -1) is not None, "negative margin refused")
    check(tms.enabled is True, "enabled")


def test_memory_margin_refuses_resume():
    tms, be = saver(free=10 << 20)
    with tms.region(tag="kv"):
        be.alloc(4 << 20, b"k")
    tms.memory_margin_bytes = 8 << 20
    check(tms.memory_margin_bytes == 8 << 20, "the margin reads back")
    tms.pause()
    msg = raises(RuntimeError, tms.resume)
    check(msg is not None and "memory_margin_bytes" in msg, "resume refused: the margin would not stay free")
    check(be.pools[("tms.n.kv", 0)].asleep, "nothing woken by the refused resume")
    tms.memory_margin_bytes = 1 << 20
    tms.resume()
    check(not be.pools[("tms.n.kv", 0)].asleep, "resumed within the margin")


def test_devices_and_graphs():
    tms, be = saver()
    for dev in (0, 1):
        be.device = dev
        with tms.region(tag="t", enable_cpu_backup=True):
            be.alloc(4096, pattern(dev, 4096))
    be.device = 0
    tms.pause("t")
    check(be.pools[("tms.b.t", 0)].asleep and be.pools[("tms.b.t", 1)].asleep, "pause(tag) on every device")
    check(("sync", 0) in be.calls and ("sync", 1) in be.calls, "each device's work waited for")
    tms.resume("t")

    class Graph:
        pool = None
    g = Graph()
    with tms.cuda_graph(g, tag="graph"):
        be.alloc(4096, b"g")
    check(g.pool == be.pools[("tms.n.graph", 0)].id, "the graph captured into its tag's pool")
    g2 = Graph()
    with tms.cuda_graph(g2, pool=g.pool, tag="graph"):
        pass
    check(g2.pool == g.pool, "a second graph shares the tag's pool")
    check(raises(ValueError, lambda: tms.cuda_graph(Graph(), pool=(1, 2), tag="graph").__enter__()) is not None,
          "another pool refused")
    tms.pause("graph")
    check(be.pools[("tms.n.graph", 0)].asleep, "the graph's memory pauses with its tag")
    tms.resume("graph")


def test_module_level_singleton():
    check(isinstance(fms.torch_memory_saver, fms.TorchMemorySaver), "the singleton")
    for name in ("region", "pause", "resume", "cuda_graph", "disable", "get_cpu_backup", "configure_subprocess"):
        check(callable(getattr(fms, name, None)), "module-level %s" % name)


RING = 4096
STAGED_SIZES = [1, 2, RING - 1, RING, RING + 1, 2 * RING, 3 * RING + 7, 5 * RING - 1, 100, 12345, 1]


def staged_workload(**kw):
    """Weights of many sizes (around and across the staging buffer, 1-byte tails) with backup, a cache without."""
    tms, be = saver(**kw)
    be.ring_bytes = RING
    with tms.region(tag="w", enable_cpu_backup=True):
        ws = [be.alloc(n, pattern(i, n)) for i, n in enumerate(STAGED_SIZES)]
        empty = be.alloc(0, b"")
    with tms.region(tag="kv"):
        kv = be.alloc(3 * RING, b"k")
    return tms, be, ws, empty, kv


def test_staged_copies_bitwise_for_many_sizes():
    tms, be, ws, empty, kv = staged_workload()
    total = sum(STAGED_SIZES)
    for cycle in range(3):
        want = [pattern(i + 17 * cycle, n) for i, n in enumerate(STAGED_SIZES)]
        for w, d in zip(ws, want):
            w.write(d)
        fills0 = be.fills
        tms.pause()
        check(be.fills - fills0 == -(-total // RING), "cycle %d: the backup packed into %d staging buffers" %
              (cycle, -(-total // RING)))
        check(tms.host_bytes() == total and sum(len(b) for b in be.host.values()) == total,
              "cycle %d: host memory for the allocated bytes only" % cycle)
        check(all(tms.get_cpu_backup(w)[1] == d for w, d in zip(ws, want)),
              "cycle %d: get_cpu_backup of every size while paused" % cycle)
        check(tms.get_cpu_backup(empty) is None or tms.get_cpu_backup(empty)[1] == b"",
              "cycle %d: a 0-byte allocation has no bytes" % cycle)
        tms.resume()
        check(all(w.read() == d for w, d in zip(ws, want)), "cycle %d: every size restored bitwise" % cycle)
        check(not be.host and tms.host_bytes() == 0, "cycle %d: every host block given back at resume" % cycle)
    allocs = [c for c in be.calls if c[0] == "host_alloc"]
    frees = [c for c in be.calls if c[0] == "host_free"]
    check(len(allocs) == 3 and len(frees) == 3, "one host block mapped and unmapped per cycle")


def test_staged_retained_copies_keep_one_address():
    tms, be, ws, _, _ = staged_workload()
    tms.retain_cpu_backup = True
    tms.pause("w")
    addrs = [tms.get_cpu_backup(w, zero_copy=True)[0] for w in ws]
    tms.resume("w")
    new = [pattern(i + 50, n) for i, n in enumerate(STAGED_SIZES)]
    for w, d in zip(ws, new):
        w.write(d)
    tms.pause("w")
    got = [tms.get_cpu_backup(w, zero_copy=True) for w in ws]
    check([g[0] for g in got] == addrs and [g[1] for g in got] == new,
          "retained copies: refreshed in place at one address, every size")
    check(len([c for c in be.calls if c[0] == "host_alloc"]) == 1, "no new host block for retained copies")
    tms.retain_cpu_backup = False
    tms.resume("w")
    check(all(w.read() == d for w, d in zip(ws, new)) and not be.host, "restored, then given back")


def test_failed_pause_copy_leaves_the_tag_awake_and_frees_its_host_memory():
    for nth in (1, 2, 3):
        tms, be, ws, _, kv = staged_workload()
        want = [w.read() for w in ws]
        be.fail_fill = nth
        msg = raises(RuntimeError, tms.pause, "w")
        check(msg is not None and "staging" in msg, "fill %d: the failed copy raises" % nth)
        check(not be.pools[("tms.b.w", 0)].asleep and not tms.tags()["w"]["paused"],
              "fill %d: the tag stays awake" % nth)
        check(all(w.read() == d for w, d in zip(ws, want)), "fill %d: its device bytes untouched" % nth)
        check(not be.host and tms.host_bytes() == 0, "fill %d: the host block it mapped given back" % nth)
        tms.pause()
        tms.resume()
        check(all(w.read() == d for w, d in zip(ws, want)) and not be.host, "fill %d: the next cycle works" % nth)
    # with retained copies: a half-refreshed copy is not kept
    tms, be, ws, _, _ = staged_workload()
    tms.retain_cpu_backup = True
    tms.pause("w")
    tms.resume("w")
    check(be.host, "retained copies held")
    be.fail_fill = 2
    check(raises(RuntimeError, tms.pause, "w") is not None, "a failed refresh of retained copies raises")
    check(not be.host and all(tms.get_cpu_backup(w) is None for w in ws),
          "the half-refreshed retained copies dropped")
    # host memory refused
    tms, be, ws, _, _ = staged_workload()
    be.fail_host_alloc = True
    check(raises(MemoryError, tms.pause) is not None, "host memory refused: MemoryError")
    check(not be.pools[("tms.b.w", 0)].asleep and not be.host, "the tag awake, nothing held")
    # the sleep refused after the copy
    tms, be, ws, _, _ = staged_workload()
    be.fail_sleep = True
    check(raises(RuntimeError, tms.pause, "w") is not None, "a failed sleep raises")
    check(not be.pools[("tms.b.w", 0)].asleep and not be.host, "the copy of a tag that did not sleep given back")


def test_pause_whose_sleep_fails_asleep_leaves_the_tag_paused_with_its_copies():
    tms, be, ws, _, _ = staged_workload()
    want = [w.read() for w in ws]
    be.fail_sleep_asleep = "tms.b.w"
    check(raises(RuntimeError, tms.pause, "w") is not None, "a sleep that fails with the pool asleep raises")
    check(be.pools[("tms.b.w", 0)].asleep and tms.tags()["w"]["paused"], "the tag paused, as its pool is")
    check(all(tms.get_cpu_backup(w)[1] == d for w, d in zip(ws, want)), "its host copies kept, bytes intact")
    tms.resume()
    check(all(w.read() == d for w, d in zip(ws, want)) and not be.host and not tms.tags()["w"]["paused"],
          "the resume restores bitwise and gives the copies back")
    # a failed copy back whose sleep again raises with the pool asleep: paused, the copies kept
    tms, be, ws, _, _ = staged_workload()
    want = [w.read() for w in ws]
    tms.pause("w")
    be.fail_fill, be.fail_sleep_asleep = 2, "tms.b.w"
    msg = raises(RuntimeError, tms.resume, "w")
    check(msg is not None and "staging" in msg, "the copy back's error raised (%s)" % msg)
    check(be.pools[("tms.b.w", 0)].asleep and tms.tags()["w"]["paused"] and
          all(tms.get_cpu_backup(w)[1] == d for w, d in zip(ws, want)), "paused again, its copies kept")
    tms.resume()
    check(all(w.read() == d for w, d in zip(ws, want)) and not be.host, "the next resume restores bitwise")


def test_failed_resume_copy_leaves_the_tag_paused_with_its_copies():
    for nth in (1, 3):
        tms, be, ws, _, _ = staged_workload()
        want = [w.read() for w in ws]
        tms.pause()
        held = tms.host_bytes()
        be.fail_fill = nth
        msg = raises(RuntimeError, tms.resume, "w")
        check(msg is not None, "fill %d: the failed restore raises" % nth)
        check(be.pools[("tms.b.w", 0)].asleep and tms.tags()["w"]["paused"], "fill %d: the tag paused again" % nth)
        check(tms.host_bytes() == held and all(tms.get_cpu_backup(w)[1] == d for w, d in zip(ws, want)),
              "fill %d: its host copies kept, bytes intact" % nth)
        tms.resume()
        check(all(w.read() == d for w, d in zip(ws, want)) and not be.host,
              "fill %d: the next resume restores bitwise and gives the copies back" % nth)
    # the restore fails and so does the sleep that would undo the wake
    tms, be, ws, _, _ = staged_workload()
    want = [w.read() for w in ws]
    tms.pause("w")
    be.fail_fill, be.fail_sleep = 2, True
    msg = raises(RuntimeError, tms.resume, "w")
    check(msg is not None and "kept" in msg, "both failed: the error says the copies are kept")
    check(not tms.tags()["w"]["paused"] and all(tms.get_cpu_backup(w)[1] == d for w, d in zip(ws, want)),
          "both failed: the tag awake, its copies kept for get_cpu_backup")


def test_staging_ring_unpinned_once_nothing_is_left_to_restore():
    tms, be, ws, _, kv = staged_workload()
    want = [w.read() for w in ws]
    for cycle in range(3):
        tms.pause()
        check(tms.staging_bytes() == 2 * RING, "cycle %d: the ring pinned while the backup is paused" % cycle)
        tms.resume()
        check(tms.staging_bytes() == 0 and not be.rings, "cycle %d: the ring unpinned at the resume" % cycle)
    check(be.ring_pins == 3, "one ring pinned per cycle (%d)" % be.ring_pins)
    check(all(w.read() == d for w, d in zip(ws, want)), "bytes restored every cycle")
    # a tag without backup paused alone needs no ring; a backup tag still paused keeps it
    tms.pause("kv")
    check(be.ring_pins == 3 and not be.rings, "pausing a tag without backup pins nothing")
    tms.pause("w")
    tms.resume("kv")
    check(tms.staging_bytes() == 2 * RING, "the ring stays while the backup tag is paused")
    tms.resume("w")
    check(not be.rings, "unpinned once the backup tag resumed")
    # retained copies: the ring goes all the same (the copies are pageable host memory)
    tms.retain_cpu_backup = True
    tms.pause()
    tms.resume()
    check(not be.rings and be.host, "retained copies kept, the ring unpinned")
    tms.retain_cpu_backup = False
    # a pause whose copy fails leaves nothing paused: the ring it pinned goes
    be.fail_fill = 1
    check(raises(RuntimeError, tms.pause, "w") is not None and not be.rings,
          "a failed pause unpins the ring it made")
    # a ring that cannot be freed stays, with a warning; the next resume frees it
    tms.pause()
    be.fail_release = True
    import warnings
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        tms.resume()
    check(any("stays pinned" in str(w.message) and "release_staging" in str(w.message) for w in got),
          "a ring that cannot be freed: a warning that says so")
    check(tms.staging_bytes() == 2 * RING and all(w.read() == d for w, d in zip(ws, want)),
          "the resume completed, the ring kept")
    tms.release_staging()
    check(not be.rings, "release_staging() frees it")
    # FABPOOL_STAGE_KEEP=1: kept for the process
    os.environ["FABPOOL_STAGE_KEEP"] = "1"
    try:
        tms2, be2, _, _, _ = staged_workload()
    finally:
        del os.environ["FABPOOL_STAGE_KEEP"]
    for _ in range(2):
        tms2.pause()
        tms2.resume()
    check(be2.ring_pins == 1 and be2.rings, "FABPOOL_STAGE_KEEP=1: one ring, kept")


def test_stage_config_follows_the_cpus():
    saved = {k: os.environ.pop(k, None) for k in ("FABPOOL_STAGE_LANES", "FABPOOL_STAGE_MIB")}
    real = fabpool_stage._cpus
    try:
        for cpus, lanes, mib in ((1, 1, 16), (4, 4, 4), (8, 8, 2), (16, 16, 1), (128, 16, 1)):
            fabpool_stage._cpus = lambda c=cpus: c
            check(fms._stage_config() == (lanes, mib), "%d CPUs: %d lanes of %d MiB (%s)" %
                  (cpus, lanes, mib, fms._stage_config()))
        os.environ["FABPOOL_STAGE_LANES"] = "3"
        check(fms._stage_config() == (3, 5), "FABPOOL_STAGE_LANES=3: 3 lanes, 16 / 3 MiB")
        os.environ["FABPOOL_STAGE_MIB"] = "32"
        check(fms._stage_config() == (3, 32), "FABPOOL_STAGE_MIB=32 over the default")
        os.environ["FABPOOL_STAGE_LANES"] = "17"
        msg = raises(ValueError, fms._stage_config)
        check(msg is not None and "1 to 16" in msg, "FABPOOL_STAGE_LANES=17 refused, the range said")
    finally:
        fabpool_stage._cpus = real
        for k, v in saved.items():
            os.environ.pop(k, None)
            if v is not None:
                os.environ[k] = v
    check(1 <= fms._stage_config()[0] <= 16, "the machine's own lanes in range")


def test_cumem_allocator():
    be = FakeBackend()
    alloc = fabpool_cumem.CuMemAllocator(backend=be)
    check(fabpool_cumem.CuMemAllocator.get_instance() is fabpool_cumem.CuMemAllocator.get_instance(),
          "get_instance: one instance")
    check(fabpool_cumem.cumem_available, "cumem_available")
    wd, kd, od = pattern(1, 1 << 20), pattern(2, 1 << 20), pattern(3, 4096)
    with alloc.use_memory_pool():
        check(alloc.current_tag == "default", "default tag inside")
        w = be.alloc(len(wd), wd)
        with alloc.use_memory_pool(tag="kv_cache"):
            check(alloc.current_tag == "kv_cache", "nested tag")
            k = be.alloc(len(kd), kd)
        check(alloc.current_tag == "default", "the outer tag again")
    with alloc.use_memory_pool(tag="weights"):
        o = be.alloc(len(od), od)
    check(alloc.get_current_usage() == len(wd) + len(kd) + len(od), "get_current_usage: the pools' bytes")
    alloc.sleep()
    sl = {c[1]: c[3] for c in be.calls if c[0] == "sleep"}
    check(sl == {"vllm.default": False, "vllm.kv_cache": False, "vllm.weights": False},
          "sleep(): every tag slept with discard")
    check(be.copied and all(w.addr <= a < w.addr + w.nbytes and to_host for a, to_host in be.copied),
          "sleep(): default copied to the host, the rest not")
    check(alloc.get_current_usage() == len(wd) + len(kd) + len(od), "get_current_usage unchanged while asleep")
    check(("empty_cache",) in be.calls, "sleep empties PyTorch's cache")
    alloc.wake_up(tags=["default"])
    check(w.read() == wd and be.pools[("vllm.kv_cache", 0)].asleep, "wake_up(tags): those only, restored")
    check(alloc.sleeping_tags() == [("kv_cache", 0), ("weights", 0)], "the others still asleep")
    alloc.sleep(offload_tags="weights")
    check(len([c for c in be.calls if c[0] == "sleep"]) == 4, "sleep again: only the awake tag")
    alloc.wake_up()
    check(k.read() != kd and o.read() != od, "wake_up(): discarded bytes gone")
    check(w.read() != wd, "default, awake at the second sleep and not in its offload_tags: discarded")
    check(alloc.sleeping_tags() == [], "all awake")
    o.write(od)
    alloc.sleep(offload_tags="weights")
    alloc.wake_up()
    check(o.read() == od, "offload_tags as a string: that tag offloaded")
    be.free = 0
    alloc.sleep(offload_tags=("weights",))
    check(raises(RuntimeError, alloc.wake_up) is not None, "a wake_up without device memory raises")
    be.free = 1 << 40
    alloc.wake_up()
    check(o.read() == od and alloc.sleeping_tags() == [], "the failed wake_up completed by the next one")


def cumem_workload(**kw):
    """vLLM's tags on the fake: weights of many sizes (around and across the staging buffer) and a segment
    PyTorch caches free, a KV cache; the staging buffer RING bytes."""
    be = FakeBackend(**kw)
    be.ring_bytes = RING
    alloc = fabpool_cumem.CuMemAllocator(backend=be)
    with alloc.use_memory_pool(tag="weights"):
        ws = [be.alloc(n, pattern(i, n)) for i, n in enumerate(STAGED_SIZES)]
        cached = be.alloc(3 * RING, b"c")
    be.free_tensor(cached)   # freed: PyTorch keeps the segment, nothing allocated in it
    with alloc.use_memory_pool(tag="kv_cache"):
        kv = be.alloc(3 * RING, b"k")
    return alloc, be, ws, cached, kv


def held_copies(alloc, be):
    """Host bytes the allocator holds: what it says and what the fake has mapped (every mapping counted)."""
    return getattr(alloc, "host_bytes", lambda: None)(), sum(len(b) for b in be.host.values())


def test_cumem_offload_goes_through_the_staging_ring():
    alloc, be, ws, cached, kv = cumem_workload()
    total = sum(STAGED_SIZES)
    for cycle in range(3):
        want = [pattern(i + 31 * cycle, n) for i, n in enumerate(STAGED_SIZES)]
        for w, d in zip(ws, want):
            w.write(d)
        kv.write(b"k" * kv.nbytes)
        fills0, calls0, copied0 = be.fills, len(be.calls), len(be.copied)
        alloc.sleep(offload_tags=("weights",))
        calls = be.calls[calls0:]
        check(sorted((c[1], c[3]) for c in calls if c[0] == "sleep") ==
              [("vllm.kv_cache", False), ("vllm.weights", False)],
              "cycle %d: both tags slept with discard (the library copies nothing)" % cycle)
        check(be.fills - fills0 == -(-total // RING),
              "cycle %d: the weights packed into %d staging buffers (%d)" % (cycle, -(-total // RING),
                                                                              be.fills - fills0))
        addrs = {a for a, _ in be.copied[copied0:]}
        check(addrs and not any(kv.addr <= a < kv.addr + kv.nbytes for a in addrs),
              "cycle %d: the discarded tag is not copied" % cycle)
        check(addrs and not any(cached.addr <= a < cached.addr + cached.nbytes for a in addrs),
              "cycle %d: a segment with nothing allocated is not copied" % cycle)
        check([c for c in calls if c[0] == "host_alloc"] == [("host_alloc", total)],
              "cycle %d: one pageable mapping for the weights' allocated bytes" % cycle)
        check(held_copies(alloc, be) == (total, total), "cycle %d: host copies held while asleep %s" %
              (cycle, held_copies(alloc, be)))
        check(getattr(alloc, "staging_bytes", lambda: None)() == 2 * RING and 0 in be.rings,
              "cycle %d: the staging ring pinned while the weights sleep" % cycle)
        check(alloc.get_current_usage() == total + 6 * RING, "cycle %d: get_current_usage while asleep" % cycle)
        alloc.wake_up()
        check(all(w.read() == d for w, d in zip(ws, want)), "cycle %d: every size restored bitwise" % cycle)
        check(kv.read() != b"k" * kv.nbytes, "cycle %d: the discarded tag's bytes dropped" % cycle)
        check(held_copies(alloc, be) == (0, 0) and [c for c in be.calls[calls0:] if c[0] == "host_free"],
              "cycle %d: the host copy unmapped by wake_up" % cycle)
        check(not be.rings and alloc.staging_bytes() == 0, "cycle %d: the ring unpinned after the last wake_up" %
              cycle)
        check(alloc.sleeping_tags() == [], "cycle %d: all awake" % cycle)
    check(be.ring_pins == 3, "one ring pinned per cycle (%d)" % be.ring_pins)
    # nothing offloaded: no ring, no host memory
    alloc.sleep(offload_tags=())
    check(be.ring_pins == 3 and not be.host and not be.rings, "sleep without offload: no copy, no ring")
    alloc.wake_up()


def test_cumem_ring_held_while_an_offloaded_tag_sleeps():
    alloc, be, ws, _, kv = cumem_workload()
    want = [w.read() for w in ws]
    kv.write(pattern(9, kv.nbytes))
    alloc.sleep(offload_tags=("weights", "kv_cache"))
    alloc.wake_up(tags=["weights"])
    check(all(w.read() == d for w, d in zip(ws, want)), "wake_up(weights): restored")
    check(be.rings and getattr(alloc, "host_bytes", lambda: None)() == kv.nbytes,
          "the KV cache still asleep: its copy and the ring kept")
    n_wakes = len([c for c in be.calls if c[0] == "wake"])
    alloc.wake_up(tags=["weights"])
    check(len([c for c in be.calls if c[0] == "wake"]) == n_wakes and be.rings,
          "wake_up of an awake tag does nothing")
    calls0 = len(be.calls)
    alloc.sleep(offload_tags=("weights",))
    check([c[1] for c in be.calls[calls0:] if c[0] == "sleep"] == ["vllm.weights"],
          "sleep leaves a tag already asleep as it is")
    alloc.wake_up()
    check(kv.read() == pattern(9, kv.nbytes) and all(w.read() == d for w, d in zip(ws, want)),
          "both restored bitwise")
    check(not be.rings and not be.host, "the ring unpinned and the copies unmapped after the last wake_up")
    # FABPOOL_STAGE_KEEP=1: the ring kept for the process
    os.environ["FABPOOL_STAGE_KEEP"] = "1"
    try:
        alloc2, be2, _, _, _ = cumem_workload()
    finally:
        del os.environ["FABPOOL_STAGE_KEEP"]
    for _ in range(2):
        alloc2.sleep(offload_tags=("weights",))
        alloc2.wake_up()
    check(be2.ring_pins == 1 and be2.rings and not be2.host, "FABPOOL_STAGE_KEEP=1: one ring, kept; copies unmapped")


def test_cumem_failed_sleep_leaves_the_tag_awake_and_nothing_held():
    cases = (("host memory refused", MemoryError, lambda be: setattr(be, "fail_host_alloc", True)),
             ("the copy's first buffer", RuntimeError, lambda be: setattr(be, "fail_fill", 1)),
             ("the copy's third buffer", RuntimeError, lambda be: setattr(be, "fail_fill", 3)),
             ("the sleep after the copy", RuntimeError, lambda be: setattr(be, "fail_sleep_tag", "vllm.weights")))
    for what, exc, arm in cases:
        alloc, be, ws, _, kv = cumem_workload()
        want = [w.read() for w in ws]
        arm(be)
        msg = raises(exc, alloc.sleep, offload_tags=("weights",))
        check(msg is not None, "%s: sleep raises %s" % (what, exc.__name__))
        check(not be.pools[("vllm.weights", 0)].asleep and ("weights", 0) not in alloc.sleeping_tags(),
              "%s: the weights stay awake" % what)
        check(all(w.read() == d for w, d in zip(ws, want)), "%s: their device bytes as they were" % what)
        check(alloc.sleeping_tags() == [("kv_cache", 0)] and be.pools[("vllm.kv_cache", 0)].asleep,
              "%s: the tag before it asleep, and known to be (%s)" % (what, alloc.sleeping_tags()))
        check(held_copies(alloc, be) == (0, 0) and not be.rings,
              "%s: no host mapping left, the ring unpinned (%s, rings %s)" % (what, held_copies(alloc, be),
                                                                               be.rings))
        alloc.sleep(offload_tags=("weights",))
        alloc.wake_up()
        check(all(w.read() == d for w, d in zip(ws, want)) and not be.host and not be.rings,
              "%s: the next cycle restores bitwise, nothing held" % what)


def test_cumem_sleep_that_fails_asleep_keeps_the_tag_asleep_with_its_copy():
    for mode in ("staged", "pinned"):
        alloc, be, ws, _, _ = cumem_workload()
        alloc.offload = mode
        want = [w.read() for w in ws]
        be.fail_sleep_asleep = "vllm.weights"
        check(raises(RuntimeError, alloc.sleep, offload_tags=("weights",)) is not None,
              "%s: a sleep that fails with the pool asleep raises" % mode)
        check(alloc.sleeping_tags() == [("kv_cache", 0), ("weights", 0)],
              "%s: the failing tag known to be asleep too (%s)" % (mode, alloc.sleeping_tags()))
        check(mode == "pinned" or held_copies(alloc, be)[1] == sum(STAGED_SIZES),
              "%s: its host copy kept (%s)" % (mode, held_copies(alloc, be)))
        alloc.wake_up()
        check(all(w.read() == d for w, d in zip(ws, want)) and not be.host and not be.rings and
              alloc.sleeping_tags() == [], "%s: wake_up restores bitwise, nothing held" % mode)
    # a failed copy back whose sleep again raises with the pool asleep: asleep, the copy kept
    alloc, be, ws, _, _ = cumem_workload()
    want = [w.read() for w in ws]
    alloc.sleep(offload_tags=("weights",))
    be.fail_fill, be.fail_sleep_asleep = 2, "vllm.weights"
    msg = raises(RuntimeError, alloc.wake_up, tags="weights")
    check(msg is not None and "staging" in msg, "the copy back's error raised (%s)" % msg)
    check(be.pools[("vllm.weights", 0)].asleep and ("weights", 0) in alloc.sleeping_tags() and
          held_copies(alloc, be)[1] == sum(STAGED_SIZES), "asleep again, its copy kept")
    alloc.wake_up()
    check(all(w.read() == d for w, d in zip(ws, want)) and not be.host and not be.rings,
          "the next wake_up restores bitwise, nothing held")


def test_cumem_failed_wake_up_keeps_the_tag_asleep_with_its_copy():
    # no device memory for the wake
    alloc, be, ws, _, _ = cumem_workload()
    want = [w.read() for w in ws]
    alloc.sleep(offload_tags=("weights",))
    held = held_copies(alloc, be)
    be.free = 0
    check(raises(RuntimeError, alloc.wake_up) is not None, "no device memory: wake_up raises")
    check(("weights", 0) in alloc.sleeping_tags() and held_copies(alloc, be) == held and be.rings,
          "no device memory: asleep, its copy and the ring kept")
    be.free = 1 << 40
    alloc.wake_up()
    check(all(w.read() == d for w, d in zip(ws, want)) and not be.host and not be.rings,
          "no device memory: the next wake_up restores bitwise, nothing held")
    # the copy back fails
    for nth in (1, 3):
        alloc, be, ws, _, _ = cumem_workload()
        want = [w.read() for w in ws]
        alloc.sleep(offload_tags=("weights",))
        held = held_copies(alloc, be)
        blocks = {k: bytes(v) for k, v in be.host.items()}
        be.fail_fill = nth
        msg = raises(RuntimeError, alloc.wake_up, tags="weights")
        check(msg is not None and "staging" in msg, "copy back, buffer %d: wake_up raises" % nth)
        check(be.pools[("vllm.weights", 0)].asleep and ("weights", 0) in alloc.sleeping_tags(),
              "copy back, buffer %d: the tag asleep again" % nth)
        check(held_copies(alloc, be) == held and {k: bytes(v) for k, v in be.host.items()} == blocks,
              "copy back, buffer %d: its host copy kept, bytes intact" % nth)
        alloc.wake_up()
        check(all(w.read() == d for w, d in zip(ws, want)) and not be.host and not be.rings,
              "copy back, buffer %d: the next wake_up restores bitwise, nothing held" % nth)
    # the copy back fails and so does the sleep that would undo the wake
    alloc, be, ws, _, _ = cumem_workload()
    want = [w.read() for w in ws]
    alloc.sleep(offload_tags=("weights",))
    be.fail_fill, be.fail_sleep = 2, True
    msg = raises(RuntimeError, alloc.wake_up)
    check(msg is not None and "kept" in msg, "both failed: the error says the copy is kept (%s)" % msg)
    check(("weights", 0) not in alloc.sleeping_tags() and held_copies(alloc, be)[1] == sum(STAGED_SIZES),
          "both failed: the tag awake, its copy kept")
    alloc.wake_up(tags=["weights"])
    check(all(w.read() == d for w, d in zip(ws, want)) and not be.host and not be.rings,
          "both failed: the next wake_up copies it again, bitwise, nothing held")


def test_cumem_devices():
    be = FakeBackend()
    be.ring_bytes = RING
    alloc = fabpool_cumem.CuMemAllocator(backend=be)
    ts = {}
    for dev in (0, 1):
        be.device = dev
        with alloc.use_memory_pool(tag="weights"):
            ts[dev] = be.alloc(3 * RING + dev, pattern(dev + 40, 3 * RING + dev))
    alloc.sleep(offload_tags=("weights",))
    check(alloc.sleeping_tags() == [("weights", 0), ("weights", 1)], "each device's pool asleep")
    check(set(be.rings) == {0, 1}, "a ring per device copied on (%s)" % sorted(be.rings))
    check(held_copies(alloc, be)[1] == 6 * RING + 1, "a host copy per (tag, device)")
    alloc.wake_up()
    check(all(ts[d].read() == pattern(d + 40, 3 * RING + d) for d in (0, 1)), "both restored bitwise")
    check(not be.rings and not be.host, "nothing held after")


def test_cumem_pinned_offload_is_the_librarys():
    saved = os.environ.pop("FABPOOL_CUMEM_OFFLOAD", None)
    try:
        os.environ["FABPOOL_CUMEM_OFFLOAD"] = "pinned"
        alloc, be, ws, _, _ = cumem_workload()
        want = [w.read() for w in ws]
        alloc.sleep(offload_tags=("weights",))
        check(sorted((c[1], c[3]) for c in be.calls if c[0] == "sleep") ==
              [("vllm.kv_cache", False), ("vllm.weights", True)], "pinned: the library offloads the weights")
        check(be.fills == 0 and not be.host and not be.rings, "pinned: no staging, no host mapping")
        alloc.wake_up()
        check(all(w.read() == d for w, d in zip(ws, want)), "pinned: restored")
        os.environ["FABPOOL_CUMEM_OFFLOAD"] = "disk"
        msg = raises(ValueError, fabpool_cumem.CuMemAllocator, backend=FakeBackend())
        check(msg is not None and "FABPOOL_CUMEM_OFFLOAD" in msg, "an unknown mode refused, the variable named")
        del os.environ["FABPOOL_CUMEM_OFFLOAD"]
        alloc, be, ws, _, _ = cumem_workload()
        check(getattr(alloc, "offload", None) == "staged", "staged by default")
        alloc.offload = "pinned"
        alloc.sleep(offload_tags=("weights",))
        check(be.fills == 0 and be.pools[("vllm.weights", 0)].offloaded is not None, "offload set to pinned")
        alloc.wake_up()
        check(raises(ValueError, setattr, alloc, "offload", "disk") is not None, "offload: an unknown mode refused")
    finally:
        os.environ.pop("FABPOOL_CUMEM_OFFLOAD", None)
        if saved is not None:
            os.environ["FABPOOL_CUMEM_OFFLOAD"] = saved


class _StageLib:
    """libfabpool_torch.so's stage functions as fabpool_stage calls them, rings by handle."""

    def __init__(self):
        self.destroyed, self.copies = [], 0

    def fabpool_torch_stage_destroy(self, ring, err, n):
        self.destroyed.append(ring)
        return 0

    def fabpool_torch_stage_pinned_bytes(self, ring):
        return 1 << 20

    def fabpool_torch_stage_copy(self, ring, items, n, to_host, err, errlen):
        self.copies += 1
        return 0


def test_stage_rings_shared_until_no_user_needs_them():
    import ctypes

    class Cuda:
        @staticmethod
        def synchronize(device):
            pass

    class Torch:
        cuda = Cuda

    proc = fabpool_stage._Process
    saved = (proc.lib, proc.rings)
    lib = _StageLib()
    proc.lib, proc.rings = lib, {0: 101}
    users = []
    try:
        for owner in ("fabpool_memory_saver", "fabpool_cumem"):
            u = fabpool_stage.Stage.__new__(fabpool_stage.Stage)   # no driver to load here
            u.torch, u.ft, u.ctypes, u._owner = Torch, None, ctypes, owner
            users.append(u)
        saver_be, cumem_be = users
        saver_be.copy(0, [(1 << 44, 1 << 32, 4096)], to_host=True)
        cumem_be.copy(0, [(1 << 45, 1 << 33, 4096)], to_host=True)
        check(lib.copies == 2 and proc.rings == {0: 101}, "both modules copy through the one ring of device 0")
        saver_be.release_staging()
        check(lib.destroyed == [] and cumem_be.staging_bytes() == 1 << 20,
              "one module done: the ring stays for the other, which has copies to restore")
        cumem_be.release_staging()
        check(lib.destroyed == [101] and proc.rings == {}, "the last one done: the ring unpinned")
    finally:
        for u in users:
            proc.holders.discard(u)
        proc.lib, proc.rings = saved


for name, fn in list(globals().items()):
    if name.startswith("test_") and callable(fn):
        try:
            fn()
        except Exception as e:   # one test's error fails it, and the others still run
            import traceback
            traceback.print_exc()
            failures.append("%s raised %r" % (name, e))
            print("FAILED: %s raised %r" % (name, e))
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("test_rl_compat: all checks passed")

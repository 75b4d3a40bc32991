"""fabpool_memory_saver (torch_memory_saver's API) and fabpool_cumem (vLLM's
CuMemAllocator) on a fake backend that holds device and host memory as bytes:
regions and nesting, tag bookkeeping, what pause / sleep copies and drops,
host copies (get_cpu_backup, retained copies, freed with their allocation),
the memory margin and the refusals.  No torch, no library: the GPU half is
test_rl_gpu.py.  Usage: test_rl_compat.py [directory of the modules]"""
import contextlib
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "python"))
import fabpool_cumem  # noqa: E402
import fabpool_memory_saver as fms  # noqa: E402

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
            p = self.pools[(n, device)]
            assert not p.asleep, "a pool put to sleep twice"
            p.asleep = True
            p.offloaded = {a: bytes(s) for a, s in p.segs.items()} if n in offload else None
            for a in p.segs:
                p.segs[a] = bytearray(b"\xee" * len(p.segs[a]))   # the memory is gone
            self.calls.append(("sleep", n, device, n in offload))

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
    real = fms._cpus
    try:
        for cpus, lanes, mib in ((1, 1, 16), (4, 4, 4), (8, 8, 2), (16, 16, 1), (128, 16, 1)):
            fms._cpus = lambda c=cpus: c
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
        fms._cpus = real
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
    check(sl == {"vllm.default": True, "vllm.kv_cache": False, "vllm.weights": False},
          "sleep(): default offloaded, the rest discarded")
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


for name, fn in list(globals().items()):
    if name.startswith("test_") and callable(fn):
        fn()
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("test_rl_compat: all checks passed")

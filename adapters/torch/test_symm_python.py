"""Symmetric memory (fabpool_symm.SymmetricMemory, libfabpool_torch.so) over 4 processes on the simulated
driver, without torch: the group's all-gather is a hub in this process, each rank a forked child that talks to
it over a pipe.  The sim's memory is host memory mapped at the device addresses, so each rank writes its own
buffer and reads its peers' through plain pointers.

  grow_shrink   random sizes up and down (each rank asks for a different share of the step's size: all get
                the largest); after each step every rank writes a pattern into its buffer and reads every
                peer's, checks that its own bytes below the new size survived the resize, that no address
                moved, and that only deltas moved (records exported <= chunks changed; imports = exports)
  (fabric)      the same with fabric handles, in the descriptors' bytes
  (pidfd)       the same, fds copied with pidfd_getfd (where the kernel lets siblings do it)
  disagreements max_bytes, handle types, hosts for POSIX fds, a size past max_bytes: every rank gets the
                same error naming what differs
  unreachable   a rank in a network namespace of its own (where the process may make one): the others'
                sockets cannot reach it, and every rank says so
  failed grow   a rank whose cuMemCreate fails: every rank keeps its size and data, the next resize works
  peer gone     a rank leaves mid-run: the others' resize fails, later calls are refused, close works
Every rank ends holding nothing (the sim's ledger).  Usage: test_symm_python.py <libfabpool_torch.so>"""
import ctypes
import multiprocessing as mp
import os
import random
import signal
import struct
import sys
import traceback
import zlib

lib_path = sys.argv[1]
sys.path.insert(0, os.path.dirname(lib_path))
import fabpool_symm  # noqa: E402

NRANKS = 4
MB = 1 << 20
CONFIG, LIMIT, OOM, IO = 7, 10, 2, 13


class Ledger(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("handles", "allocations", "mappings", "reservations",
                                                "exported_fds", "bytes_held", "bytes_mapped")] + \
               [("rest", ctypes.c_uint64 * 256)]  # the sim fills its whole struct


def cuda():
    return ctypes.CDLL(os.environ.get("FABPOOL_CUDA_LIBRARY", "libcuda.so.1"))


def ledger():
    led = Ledger()
    cuda().fabsim_get_ledger(ctypes.byref(led))
    return led


class Rank:
    """A child's side: its all-gather through the hub, and its checks."""

    def __init__(self, rank, conn):
        self.rank, self.conn, self.failures = rank, conn, []

    def allgather(self, data):
        self.conn.send_bytes(data)
        out = self.conn.recv_bytes()
        if not out:
            raise RuntimeError("a rank left the group")
        return out

    def gather(self, fmt, *values):
        """Every rank's values (a barrier too)."""
        size = struct.calcsize(fmt)
        out = self.allgather(struct.pack(fmt, *values))
        return [struct.unpack_from(fmt, out, q * size) for q in range(NRANKS)]

    def check(self, cond, what):
        if not cond:
            self.failures.append(what)
            print("rank %d: FAILED: %s" % (self.rank, what), flush=True)

    def expect_error(self, fn, status, *words):
        try:
            fn()
        except fabpool_symm.SymmetricMemoryError as e:
            msg = str(e)
            self.check(e.status == status, "status %d, expected %d: %s" % (e.status, status, msg))
            for w in words:
                self.check(w in msg, "'%s' not in the message: %s" % (w, msg))
            return msg
        self.check(False, "no error, expected status %d" % status)
        return ""

    def check_nothing_held(self):
        led = ledger()
        self.check(led.bytes_held == 0 and led.mappings == 0 and led.handles == 0 and led.exported_fds == 0 and
                   led.reservations == 0, "after close: %d bytes held, %d mappings, %d handles, %d fds, %d "
                   "reservations" % (led.bytes_held, led.mappings, led.handles, led.exported_fds, led.reservations))


def words(seed, size, n=24):
    """The same offsets on every rank: the first and last word, and some between."""
    r = random.Random(seed)
    return sorted({0, size - 8} | {r.randrange(0, size // 8) * 8 for _ in range(n)})


def pattern(rank, step, off):
    return ((rank + 1) << 56) ^ (step << 32) ^ off


def put(base, off, value):
    ctypes.c_uint64.from_address(base + off).value = value


def get(base, off):
    return ctypes.c_uint64.from_address(base + off).value


def grow_shrink(me, transport="socket", steps=40, conf=None):
    rank = me.rank
    sm = fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 64 * MB, (rank + 1) * MB, fd_transport=transport,
                                      conf=conf)
    me.check(sm.info()["handle_type"] == (conf or "handle_type:posix_fd").split(":")[1], "handle type %s" %
             sm.info()["handle_type"])
    me.check(sm.size == NRANKS * MB, "created at %d bytes, expected the largest asked (%d)" % (sm.size, NRANKS * MB))
    first = sm.ptrs
    me.check(len(set(first)) == NRANKS and all(first), "every rank's buffer has an address here: %s" % first)
    info = sm.info()
    me.check(info["last_exported"] >= 1 and info["last_imported"] >= NRANKS - 1, "the first exchange: %s" % info)
    rng = random.Random(1234)  # the same sizes on every rank
    mine_rng = random.Random(rank)  # what this rank asks
    size, prev_offs = sm.size, []
    for step in range(1, steps + 1):
        new = rng.randrange(1, 64) * MB + rng.choice((0, 4096, 3 * 65536))
        if step % 9 == 0:
            new = size  # the same size: nothing to do
        ask = new if rank == step % NRANKS else mine_rng.choice((0, new // 2, new))
        gen0 = info["generation"]
        sm.resize(ask)
        info = sm.info()
        me.check(info["size"] == new, "step %d: size %d, expected %d" % (step, info["size"], new))
        me.check(sm.ptrs == first, "step %d: an address moved" % step)
        sizes = sm.sizes
        me.check(all(s >= new for s in sizes), "step %d: views cover %s, size %d" % (step, sizes, new))
        # only deltas: a chunk is named once, when it is mapped (or replaced)
        me.check(info["last_exported"] <= info["generation"] - gen0,
                 "step %d: exported %d records for %d chunk changes" % (step, info["last_exported"],
                                                                         info["generation"] - gen0))
        if new == size:
            me.check(info["last_exported"] == 0 and info["last_imported"] == 0, "step %d: same size, yet %s" %
                     (step, info))
        # this rank's bytes below the new size survived the resize
        mine = sm.ptrs[rank]
        for off in prev_offs:
            if off + 8 <= new:
                me.check(get(mine, off) == pattern(rank, step - 1, off), "step %d: own word at %d lost" % (step, off))
        offs = words(step, new)
        for off in offs:
            put(mine, off, pattern(rank, step, off))
        counts = me.gather("QQ", info["last_exported"], info["last_imported"])  # also: every rank has written
        me.check(counts[rank][1] == sum(c[0] for q, c in enumerate(counts) if q != rank),
                 "step %d: imported %d records, the peers exported %s" % (step, counts[rank][1], counts))
        bad = 0
        for q in range(NRANKS):
            for off in offs:
                bad += get(sm.ptrs[q], off) != pattern(q, step, off)
        me.check(bad == 0, "step %d: %d words of the peers' buffers read wrong" % (step, bad))
        me.gather("Q", 0)  # nobody resizes while a peer reads
        size, prev_offs = new, offs
    info = sm.info()
    me.check(info["exchanges"] == steps + 1, "exchanges: %s" % info)
    sm.close()
    me.check_nothing_held()


def grow_shrink_fabric(me):
    """Fabric handles (the sim permits them with FABSIM_FABRIC=1): the handles travel in the descriptors."""
    os.environ["FABSIM_FABRIC"] = "1"  # read at this process's cuInit, which the pool's creation makes
    grow_shrink(me, steps=12, conf="handle_type:fabric")


def disagreements(me):
    rank = me.rank
    # max_bytes
    msg = me.expect_error(lambda: fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, (64 + (rank == 2)) * MB,
                                                               MB), CONFIG, "max_bytes differs", "rank 2: %d" %
                          (65 * MB), "rank 0: %d" % (64 * MB))
    same = me.gather("Q", zlib.crc32(msg.encode()))
    me.check(len(set(same)) == 1, "every rank has the same message")
    # handle types: rank 3's pool is local memory
    conf = "handle_type:none" if rank == 3 else "handle_type:posix_fd"
    me.expect_error(lambda: fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 64 * MB, MB, conf=conf), CONFIG,
                    "different handle types", "rank 3: none", "rank 0: posix_fd")
    # hosts: POSIX fds cannot cross them
    host = "elsewhere" if rank == 1 else None
    me.expect_error(lambda: fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 64 * MB, MB, host=host), CONFIG,
                    "rank 1 on host 'elsewhere'", "fabric")
    # fd transports
    tr = "pidfd" if rank == 0 else "socket"
    me.expect_error(lambda: fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 64 * MB, MB, fd_transport=tr),
                    CONFIG, "different fd transports", "rank 0: pidfd")
    # a size past max_bytes, at create and at resize: every rank refuses, nothing changes
    me.expect_error(lambda: fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 64 * MB,
                                                         65 * MB if rank == 3 else MB), LIMIT, "rank 3")
    sm = fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 64 * MB, 8 * MB)
    me.expect_error(lambda: sm.resize(100 * MB if rank == 2 else 16 * MB), LIMIT, "rank 2 asked for %d" % (100 * MB),
                    "nothing changed")
    me.check(sm.size == 8 * MB, "the size after a refused resize: %d" % sm.size)
    sm.resize(0 if rank else 16 * MB)
    me.check(sm.size == 16 * MB, "the size after ranks 1-3 asked 0: %d" % sm.size)
    sm.close()
    me.check_nothing_held()


def unreachable(me):
    """Rank 3 in a network namespace of its own: the abstract sockets of the others cannot reach it."""
    rank = me.rank
    ok = 1
    if rank == 3:
        ok = int(ctypes.CDLL(None, use_errno=True).unshare(0x40000000) == 0)  # CLONE_NEWNET
    if not all(x[0] for x in me.gather("Q", ok)):
        if rank == 0:
            print("unreachable: skipped: this process may not make a network namespace", flush=True)
        return
    me.expect_error(lambda: fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 64 * MB, MB, timeout_s=0.5),
                    IO, "rank 0", "cannot reach rank 3", "network namespace")
    me.check_nothing_held()


def failed_grow(me):
    rank = me.rank
    sm = fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 256 * MB, 8 * MB)
    mine = sm.ptrs[rank]
    put(mine, 0, pattern(rank, 7, 0))
    put(mine, 8 * MB - 8, pattern(rank, 7, 1))
    me.gather("Q", 0)
    c = cuda()
    if rank == 1:  # every cuMemCreate fails from now (out of memory even after fabpool's trim and retry)
        c.fabsim_fault_set(b"cuMemCreate", ctypes.c_uint64(0), 1, OOM)
    me.expect_error(lambda: sm.resize(200 * MB), OOM, "rank 1", "every rank keeps its old size (%d" % (8 * MB))
    if rank == 1:
        c.fabsim_fault_clear()
    me.check(sm.size == 8 * MB and all(s >= 8 * MB for s in sm.sizes), "sizes after the failed grow")
    for q in range(NRANKS):
        me.check(get(sm.ptrs[q], 0) == pattern(q, 7, 0) and get(sm.ptrs[q], 8 * MB - 8) == pattern(q, 7, 1),
                 "rank %d's data after the failed grow" % q)
    sm.resize(200 * MB)
    put(mine, 200 * MB - 8, pattern(rank, 8, 2))
    me.gather("Q", 0)
    for q in range(NRANKS):
        me.check(get(sm.ptrs[q], 200 * MB - 8) == pattern(q, 8, 2) and get(sm.ptrs[q], 0) == pattern(q, 7, 0),
                 "rank %d's data after the grow" % q)
    me.gather("Q", 0)
    sm.close()
    me.check_nothing_held()


def peer_gone(me):
    rank = me.rank
    sm = fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 64 * MB, 4 * MB)
    if rank == 3:
        sm.close()
        me.check_nothing_held()
        return  # leaves the group: the hub tells the others at their next all-gather
    me.expect_error(lambda: sm.resize(32 * MB), IO, "all-gather failed")
    me.expect_error(lambda: sm.resize(32 * MB), IO, "broke off", "only close is left")
    sm.close()
    me.check_nothing_held()


def child(rank, pipes, scenario):
    for r, (a, b) in enumerate(pipes):  # only its own end stays open here: the hub sees EOF when it exits
        a.close()
        if r != rank:
            b.close()
    conn = pipes[rank][1]
    me = Rank(rank, conn)
    signal.alarm(60)  # a rank stuck in a round: it dies, the hub tells the others
    try:
        scenario(me)
    except Exception:  # noqa: BLE001 - reported as a failure of this rank
        me.failures.append(traceback.format_exc())
        print("rank %d:\n%s" % (rank, me.failures[-1]), flush=True)
    conn.close()
    os._exit(min(len(me.failures), 100))


def run(name, scenario):
    """Forks NRANKS children and serves their all-gathers until all have left."""
    ctx = mp.get_context("fork")
    pipes = [ctx.Pipe() for _ in range(NRANKS)]
    procs = [ctx.Process(target=child, args=(r, pipes, scenario)) for r in range(NRANKS)]
    for p in procs:
        p.start()
    conns = [a for a, _ in pipes]
    for _, b in pipes:
        b.close()
    live = set(range(NRANKS))
    while live:
        msgs = {}
        for r in sorted(live):
            try:
                msgs[r] = conns[r].recv_bytes()
            except (EOFError, OSError):
                live.discard(r)
        gone = len(msgs) < NRANKS
        out = b"" if gone else b"".join(msgs[r] for r in range(NRANKS))  # b"": a rank has left
        for r in list(msgs):
            try:
                conns[r].send_bytes(out)
            except OSError:
                live.discard(r)
    codes = []
    for p in procs:
        p.join(60)
        codes.append(p.exitcode)
    ok = all(c == 0 for c in codes)
    print("%s: %s (exit codes %s)" % (name, "ok" if ok else "FAILED", codes), flush=True)
    return ok


def pidfd_works():
    """Whether a process may copy a sibling's fd here (pidfd_getfd, Yama, seccomp)."""
    ctx = mp.get_context("fork")
    r, w = os.pipe()
    sib = ctx.Process(target=_sibling, args=(r, w))
    sib.start()
    probe = ctx.Process(target=lambda pid: os._exit(0 if _try_getfd(pid, r) else 1), args=(sib.pid,))
    probe.start()
    probe.join(10)
    os.write(w, b"x")
    sib.join(10)
    os.close(r)
    os.close(w)
    return probe.exitcode == 0


def _sibling(r, w):
    """Allows any process to take its fds (as the library's exporters do under Yama), then waits."""
    ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(2**64 - 1), 0, 0, 0)  # PR_SET_PTRACER, PR_SET_PTRACER_ANY
    os.close(w)
    os.read(r, 1)
    os._exit(0)


def peers_option(me):
    """The peers option through the ctypes mirror of the options: any_user and any_pid widen who may connect
    (the ranks still form the group: the data crosses), an unknown word is refused before the library is
    called; info() fills a struct whose struct_size the library checks."""
    rank = me.rank
    sm = fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 64 * MB, 2 * MB, peers="any_user,any_pid")
    put(sm.ptrs[rank], 8, pattern(rank, 7, 8))
    me.gather("Q", 0)  # every rank has written
    for q in range(NRANKS):
        me.check(get(sm.ptrs[q], 8) == pattern(q, 7, 8), "rank %d's word read through the view" % q)
    me.gather("Q", 0)
    sm.resize(6 * MB)
    me.check(sm.info()["size"] == 6 * MB and "struct_size" not in sm.info(), "info after a resize: %s" % sm.info())
    sm.close()
    try:
        fabpool_symm.SymmetricMemory(me.allgather, rank, NRANKS, 64 * MB, MB, peers=["everyone"])
        me.check(False, "peers=['everyone'] was accepted")
    except ValueError as e:
        me.check("any_user" in str(e), "the refusal names the words: %s" % e)
    me.check_nothing_held()


def _try_getfd(pid, fd):
    libc = ctypes.CDLL(None, use_errno=True)
    pfd = libc.syscall(434, pid, 0)  # pidfd_open
    if pfd < 0:
        return False
    got = libc.syscall(438, pfd, fd, 0)  # pidfd_getfd
    os.close(pfd)
    if got >= 0:
        os.close(got)
    return got >= 0


def main():
    results = [run("grow_shrink", grow_shrink), run("grow_shrink_fabric", grow_shrink_fabric),
               run("disagreements", disagreements), run("unreachable", unreachable),
               run("failed_grow", failed_grow), run("peers_option", peers_option), run("peer_gone", peer_gone)]
    if pidfd_works():
        results.append(run("grow_shrink_pidfd", lambda me: grow_shrink(me, "pidfd", steps=12)))
    else:
        print("grow_shrink_pidfd: skipped: pidfd_getfd of a sibling's fd is not permitted here")
    passed = sum(results)
    print("%d passed, %d failed" % (passed, len(results) - passed))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

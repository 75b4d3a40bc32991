"""Symmetric memory that grows in place: every rank's buffer mapped by every other rank.

    import torch.distributed as dist, fabpool_torch
    buf = fabpool_torch.SymmetricBuffer(dist.group.WORLD, max_bytes=1 << 30, size=64 << 20)
    mine = buf.local(torch.float32, (n,))          # a tensor over this rank's buffer
    theirs = buf.peer(1, torch.float32, (n,))      # rank 1's buffer, mapped here
    table = buf.ptrs_tensor                        # every rank's base, a CUDA int64 tensor (for kernels)
    buf.resize(256 << 20)                          # collective: every buffer grows in place, peers get deltas
    ...                                            # mine, theirs, table and graphs over them stay valid
    buf.close()                                    # or `with SymmetricBuffer(...) as buf:`

Each rank owns a growable buffer of a fabpool pool of its own (libfabpool_torch.so,
adapters/torch/symm.h); every other rank maps it at a fixed address of its own.  A resize is
collective: every rank asks for a size, every buffer takes the largest asked (so a rank that asks
for less, or 0, never leaves the others waiting), grows or shrinks in place, and each peer maps only
the chunks mapped since the generation it holds.  No address ever changes, so tensors, pointer
tables and CUDA graphs captured over the buffers stay valid across every growth.

SymmetricMemory is the same without torch: the group is any all-gather of bytes (a callable), the
addresses are integers.  The tests on the simulated driver use it from plain processes.

Errors are SymmetricMemoryError (a RuntimeError) with .status (a fabpool_status); where the ranks
disagree (max_bytes, handle types, hosts for POSIX fds, the fd transport) every rank raises the same
error, which lists what each rank said.
"""
import ctypes

__all__ = ["SymmetricMemory", "SymmetricBuffer", "SymmetricMemoryError"]

FD_TRANSPORTS = {"socket": 0, "pidfd": 1}
PEERS = {"any_user": 0x1, "any_pid": 0x2}   # FABPOOL_FD_ANY_USER, FABPOOL_FD_ANY_PID (fabpool_fdpass.h)
HANDLE_TYPES = {0: "auto", 1: "none", 2: "posix_fd", 3: "fabric"}
STATUS_CONFIG = 7
_ALLGATHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_lib_cache = []


class _Options(ctypes.Structure):
    # fabpool_torch_symm_options in adapters/torch/symm.h
    _fields_ = [("struct_size", ctypes.c_uint32), ("rank", ctypes.c_int), ("nranks", ctypes.c_int),
                ("device", ctypes.c_int), ("max_bytes", ctypes.c_uint64), ("bytes", ctypes.c_uint64),
                ("conf", ctypes.c_char_p), ("fd_transport", ctypes.c_int), ("timeout_ms", ctypes.c_int),
                ("host", ctypes.c_char_p), ("peers", ctypes.c_uint), ("allgather", _ALLGATHER),
                ("allgather_ctx", ctypes.c_void_p)]


def _fabpool_torch():
    import fabpool_torch  # the library's loader; imported here, not at the top: fabpool_torch imports this module
    return fabpool_torch


class SymmetricMemoryError(RuntimeError):
    """A collective call failed; .status is the fabpool_status, the message says which rank and what."""

    def __init__(self, message, status=0):
        super().__init__(message)
        self.status = status


def _lib(path=None):
    if _lib_cache:
        return _lib_cache[0]
    lib = _fabpool_torch().load(path)
    u64p, vp = ctypes.POINTER(ctypes.c_uint64), ctypes.c_void_p
    decl = {
        "fabpool_torch_symm_options_init": (None, [ctypes.POINTER(_Options)]),
        "fabpool_torch_symm_create": (ctypes.c_int, [ctypes.POINTER(_Options), ctypes.POINTER(vp)]),
        "fabpool_torch_symm_resize": (ctypes.c_int, [vp, ctypes.c_uint64]),
        "fabpool_torch_symm_ptrs": (ctypes.c_int, [vp, u64p, ctypes.c_size_t]),
        "fabpool_torch_symm_sizes": (ctypes.c_int, [vp, u64p, ctypes.c_size_t]),
        # fabpool_torch_symm_info: fabpool_torch makes it from the library's layout at load
        "fabpool_torch_symm_get_info": (ctypes.c_int, [vp, ctypes.POINTER(_fabpool_torch().SymmInfo)]),
        "fabpool_torch_symm_dmabuf": (ctypes.c_int, [vp, ctypes.c_uint64, ctypes.c_uint64,
                                                     ctypes.POINTER(ctypes.c_int)]),
        "fabpool_torch_symm_close": (ctypes.c_int, [vp]),
        "fabpool_torch_symm_last_error": (ctypes.c_char_p, []),
    }
    for name, (res, args) in decl.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    _lib_cache.append(lib)
    return lib


class SymmetricMemory:
    """A growable buffer per rank of a group, each mapped by every rank; no torch needed.

    allgather(data: bytes) -> bytes: the group's all-gather, called collectively with the same
        length on every rank; returns every rank's data in rank order, joined (or a list of them).
    rank, nranks: this process's place in the group.
    max_bytes: every buffer's address window, the same on every rank.
    size: the size this rank asks now (0: whatever the others ask); every buffer gets the largest.
    device: CUDA device ordinal.  conf: the pool's options (FABPOOL_CONF syntax, e.g.
    "handle_type:posix_fd").  fd_transport: "socket" (SCM_RIGHTS between the ranks of a host) or
    "pidfd" (pidfd_getfd).  timeout_s: for the sockets.  host: the name ranks compare to find who
    shares a host (default: the host name).  library: path of libfabpool_torch.so.
    peers: who else may be a rank's process, beyond the default (the same user, the pids the ranks
    declared in the all-gather): "any_user" and/or "any_pid", comma-separated or a list, for jobs
    whose ranks run as other users or in other pid namespaces (symm.h; FABPOOL_PEERS adds to it).
    """

    def __init__(self, allgather, rank, nranks, max_bytes, size=0, device=0, conf=None, fd_transport="socket",
                 timeout_s=30.0, host=None, library=None, peers=()):
        self._h = None
        self._lib = _lib(library)
        self._allgather = allgather
        self._cb_error = None
        self._cb = _ALLGATHER(self._call_allgather)  # kept: the library calls it at every resize
        if fd_transport not in FD_TRANSPORTS:
            raise ValueError("fd_transport must be one of %s" % ", ".join(FD_TRANSPORTS))
        words = [w.strip() for w in (peers.split(",") if isinstance(peers, str) else peers) if w.strip()]
        if any(w not in PEERS for w in words):
            raise ValueError("peers: %r; the words are %s" % (peers, ", ".join(PEERS)))
        o = _Options()
        self._lib.fabpool_torch_symm_options_init(ctypes.byref(o))
        o.rank, o.nranks, o.device = int(rank), int(nranks), int(device)
        o.max_bytes, o.bytes = int(max_bytes), int(size)
        o.conf = conf.encode() if conf else None
        o.host = host.encode() if host else None
        o.fd_transport = FD_TRANSPORTS[fd_transport]
        o.timeout_ms = int(timeout_s * 1000)
        o.peers = sum(PEERS[w] for w in set(words))
        o.allgather = self._cb
        self.rank, self.nranks = int(rank), int(nranks)
        h = ctypes.c_void_p()
        self._check(self._lib.fabpool_torch_symm_create(ctypes.byref(o), ctypes.byref(h)))
        self._h = h
        self._ptrs = self._array(self._lib.fabpool_torch_symm_ptrs)

    def _call_allgather(self, _ctx, send, recv, n):
        try:
            out = self._allgather(ctypes.string_at(send, n))
            if isinstance(out, (list, tuple)):
                out = b"".join(bytes(x) for x in out)
            if len(out) != n * self.nranks:
                raise SymmetricMemoryError("the all-gather gave %d bytes, not %d ranks x %d" %
                                           (len(out), self.nranks, n))
            ctypes.memmove(recv, bytes(out), len(out))
            return 0
        except BaseException as e:  # noqa: B902 - handed back to the caller of the collective call
            self._cb_error = e
            return 1

    def _check(self, status):
        if status == 0:
            return
        err, self._cb_error = self._cb_error, None
        msg = self._lib.fabpool_torch_symm_last_error().decode(errors="replace")
        if err is not None:
            raise SymmetricMemoryError(msg, status) from err
        raise SymmetricMemoryError(msg, status)

    def _live(self):
        if self._h is None:
            raise SymmetricMemoryError("the symmetric memory is closed")
        return self._h

    def _array(self, fn):
        arr = (ctypes.c_uint64 * self.nranks)()
        self._check(fn(self._live(), arr, self.nranks))
        return [int(x) for x in arr]

    @property
    def ptrs(self):
        """Every rank's base address in this process ([rank]: this rank's buffer); they never change."""
        self._live()
        return list(self._ptrs)

    @property
    def sizes(self):
        """Bytes of every rank's buffer mapped here (a view that an apply left behind: less)."""
        return self._array(self._lib.fabpool_torch_symm_sizes)

    def info(self):
        """The counters of symm.h's fabpool_torch_symm_info, as a dict."""
        i = _fabpool_torch().SymmInfo()
        i.struct_size = ctypes.sizeof(i)
        self._check(self._lib.fabpool_torch_symm_get_info(self._live(), ctypes.byref(i)))
        d = {name: getattr(i, name) for name, _ in i._fields_ if name != "struct_size"}
        d["handle_type"] = HANDLE_TYPES.get(d["handle_type"], str(d["handle_type"]))
        d["fd_transport"] = "pidfd" if d["fd_transport"] == 1 else "socket"
        return d

    @property
    def size(self):
        return self.info()["size"]

    @property
    def max_bytes(self):
        return self.info()["max_bytes"]

    def resize(self, size):
        """Collective: every rank asks for `size` (0: the others'); every buffer takes the largest, in place.
        GPU work that touches bytes past the new size, on any rank, must be done first."""
        self._check(self._lib.fabpool_torch_symm_resize(self._live(), int(size)))

    def dmabuf(self, offset, size):
        """A dma-buf fd of [offset, offset + size) of this rank's buffer (page-aligned); the caller closes it."""
        fd = ctypes.c_int(-1)
        self._check(self._lib.fabpool_torch_symm_dmabuf(self._live(), int(offset), int(size), ctypes.byref(fd)))
        return fd.value

    def close(self):
        """Not collective: unmaps the peers' buffers here and frees this rank's (peers that still map it keep
        its memory until they close).  Tensors over the memory must not be used afterwards."""
        h, self._h = self._h, None
        if h is not None:
            self._check(self._lib.fabpool_torch_symm_close(h))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - nothing to tell at collection
            pass


def _torch_allgather(group, device):
    """The group's all-gather of bytes: CPU tensors on a gloo (or MPI, UCC) group, CUDA tensors otherwise."""
    import torch
    import torch.distributed as dist
    backend = str(dist.get_backend(group)).lower()
    on = torch.device("cpu") if any(b in backend for b in ("gloo", "mpi", "ucc")) else device
    world = dist.get_world_size(group)

    def allgather(data):
        n = len(data)
        src = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(on)
        if on.type == "cpu":
            outs = [torch.empty(n, dtype=torch.uint8) for _ in range(world)]
            dist.all_gather(outs, src, group=group)
        else:
            out = torch.empty(world * n, dtype=torch.uint8, device=on)
            dist.all_gather_into_tensor(out, src, group=group)
            outs = [out.cpu()]
        return b"".join(ctypes.string_at(t.data_ptr(), t.numel()) for t in outs)
    return allgather


def _strides(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return tuple(reversed(st))


_TYPESTR = {"float32": "<f4", "float16": "<f2", "float64": "<f8", "int64": "<i8", "int32": "<i4", "int16": "<i2",
            "int8": "|i1", "uint8": "|u1", "bool": "|b1"}


class _Cai:
    """__cuda_array_interface__ over a pointer, where torch lacks _construct_storage_from_data_pointer."""

    def __init__(self, ptr, shape, dtype):
        name = str(dtype).replace("torch.", "")
        if name not in _TYPESTR:
            raise SymmetricMemoryError("dtype %s needs torch._C._construct_storage_from_data_pointer" % name)
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": _TYPESTR[name], "data": (ptr, False),
                                         "version": 2, "strides": None, "stream": None}


def _tensor_at(ptr, dtype, shape, device):
    import torch
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * torch.empty(0, dtype=dtype).element_size()
    ctor = getattr(torch._C, "_construct_storage_from_data_pointer", None)
    if ctor is not None:
        storage = ctor(int(ptr), device, int(nbytes))
        return torch.empty(0, dtype=dtype, device=device).set_(storage, 0, tuple(shape), _strides(shape))
    return torch.as_tensor(_Cai(ptr, shape, dtype), device=device)


class SymmetricBuffer(SymmetricMemory):
    """SymmetricMemory over a torch.distributed group, with tensors over the buffers.

    group: a process group (None: the default one); its all-gather moves the descriptors (CPU tensors
    on gloo, CUDA tensors on NCCL).  max_bytes, size, conf, fd_transport, timeout_s, host, peers: as
    SymmetricMemory.  device: a CUDA device (None: the current one).

    .local(dtype, shape, offset=0) and .peer(rank, dtype, shape, offset=0) are tensors over this
    rank's buffer and over rank's buffer mapped here; .ptrs_tensor is every rank's base as a CUDA int64
    tensor.  They stay valid across resizes (addresses never change) until close(); bytes past the
    current size are not mapped (allow_unmapped=True makes a tensor there anyway, for a CUDA graph
    captured before the growth that maps them: it must not run before).
    """

    def __init__(self, group, max_bytes, size=0, device=None, conf=None, fd_transport="socket", timeout_s=30.0,
                 host=None, library=None, peers=()):
        import torch
        import torch.distributed as dist
        if group is None:
            group = dist.group.WORLD
        dev = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if dev.type != "cuda":
            raise ValueError("SymmetricBuffer needs a CUDA device, not %s" % dev)
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.init()
        self.device = dev
        self.group = group
        super().__init__(_torch_allgather(group, dev), dist.get_rank(group), dist.get_world_size(group), max_bytes,
                         size, device=dev.index, conf=conf, fd_transport=fd_transport, timeout_s=timeout_s,
                         host=host, library=library, peers=peers)
        self.ptrs_tensor = torch.tensor(self._ptrs, dtype=torch.int64, device=dev)

    def _tensor(self, rank, dtype, shape, offset, allow_unmapped):
        import torch
        shape = (int(shape),) if isinstance(shape, int) else tuple(int(d) for d in shape)
        item = torch.empty(0, dtype=dtype).element_size()
        numel = 1
        for d in shape:
            numel *= d
        end = int(offset) + numel * item
        if offset < 0 or offset % item:
            raise ValueError("offset %d is not a non-negative multiple of %s's %d bytes" % (offset, dtype, item))
        limit = self.max_bytes if allow_unmapped else min(self.size, self.sizes[rank])
        if end > limit:
            raise ValueError("bytes [%d, %d) of rank %d's buffer: past its %s (%d bytes)%s" % (
                offset, end, rank, "window" if allow_unmapped else "mapped size", limit,
                "" if allow_unmapped else "; resize first, or allow_unmapped=True for a tensor a later growth maps"))
        return _tensor_at(self._ptrs[rank] + int(offset), dtype, shape, self.device)

    def local(self, dtype, shape, offset=0, allow_unmapped=False):
        """A tensor over bytes [offset, offset + its size) of this rank's buffer."""
        self._live()
        return self._tensor(self.rank, dtype, shape, offset, allow_unmapped)

    def peer(self, rank, dtype, shape, offset=0, allow_unmapped=False):
        """A tensor over rank's buffer, mapped on this device (this rank's own: the same as local)."""
        self._live()
        if not 0 <= rank < self.nranks:
            raise ValueError("rank %d: the group has %d ranks" % (rank, self.nranks))
        return self._tensor(rank, dtype, shape, offset, allow_unmapped)

    def resize(self, size):
        """Collective; waits for this device's work first (a shrink unmaps bytes here and in the peers)."""
        import torch
        self._live()
        torch.cuda.synchronize(self.device)
        super().resize(size)

    def close(self):
        if self._h is not None:
            import torch
            torch.cuda.synchronize(self.device)
            self.ptrs_tensor = None
        super().close()


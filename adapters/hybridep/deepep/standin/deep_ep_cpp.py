"""A stand-in for DeepEP's NVSHMEM extension deep_ep_cpp, which HybridEP does
not use but `import deep_ep` imports (deep_ep/__init__.py, buffer.py,
utils.py): only the names they import.  Using any of them fails."""


class _Absent:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("deep_ep_cpp stand-in: the NVSHMEM extension is not built (HybridEP needs only hybrid_ep_cpp)")


class Config(_Absent):
    pass


class EventHandle(_Absent):
    pass


class Buffer(_Absent):
    pass


def is_sm90_compiled():
    return False


def get_low_latency_rdma_size_hint(*args, **kwargs):
    raise RuntimeError("deep_ep_cpp stand-in: no low-latency mode")

"""The PyTorch examples' check: PyTorch importable, a CUDA GPU, and (for the
MemPool ones) torch.cuda.MemPool.  Where one is missing it prints the reason
and exits 77, which ctest reports as skipped."""
import sys


def need_torch(mempool=False):
    """Returns the torch module, or exits 77 with the reason."""
    try:
        import torch
    except ImportError as e:
        print("SKIP: PyTorch is not importable (%s)" % e)
        sys.exit(77)
    if not torch.cuda.is_available():
        print("SKIP: no CUDA GPU (torch.cuda.is_available() is False)")
        sys.exit(77)
    if mempool and not hasattr(torch.cuda, "MemPool"):
        print("SKIP: this PyTorch (%s) has no torch.cuda.MemPool" % torch.__version__)
        sys.exit(77)
    return torch

"""fabpool for some tensors only: a scoped torch.cuda.MemPool.

The program keeps PyTorch's own allocator; tensors made inside
`with torch.cuda.use_mem_pool(fabpool_torch.mempool()):` come from fabpool
(dispatch buffers, say).  Their memory goes back to fabpool when the MemPool
is deleted and torch.cuda.empty_cache() runs, and fabpool_torch.empty()
returns it to the driver.

    PYTHONPATH=build/adapters/torch python3 examples/torch_mempool.py

Needs PyTorch and a GPU; exits 77 (skipped) with the reason where either is
missing."""
import gc
import sys

from need_torch import need_torch   # exits 77 (skipped) with the reason where PyTorch or a GPU is missing

torch = need_torch(mempool=True)

import fabpool_torch

weights = torch.randn(1024, 1024, device="cuda")    # PyTorch's allocator, as always

pool = fabpool_torch.mempool()                       # a MemPool on fabpool, for the current device
with torch.cuda.use_mem_pool(pool):
    dispatch = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")   # from fabpool
    dispatch.fill_(7)
checksum = int(dispatch[:1024].sum())

held = fabpool_torch.memory_stats()["reserved_bytes.all.current"]
print("fabpool holds %.1f MiB for the MemPool; weights stay with PyTorch's allocator" % (held / 2**20))

del dispatch
del pool
gc.collect()
torch.cuda.synchronize()
torch.cuda.empty_cache()          # PyTorch gives the MemPool's segments back to fabpool
fabpool_torch.empty()             # fabpool gives them back to the driver
left = fabpool_torch.memory_stats()["reserved_bytes.all.current"]
print("after the MemPool is gone: fabpool holds %.1f MiB" % (left / 2**20))
if checksum != 7 * 1024 or held < (64 << 20) or left != 0:
    print("FAILED: the MemPool's memory did not come from fabpool, or did not go back")
    sys.exit(1)
del weights
print("done")

"""fabpool as PyTorch's CUDA allocator for a whole program: install().

Call fabpool_torch.install() before the first CUDA tensor; the rest of the
program stays as it is.  torch.cuda's statistics, empty_cache(), streams and
CUDA graphs keep working; fabpool_torch.stats() says what the pool holds.

    PYTHONPATH=build/adapters/torch python3 examples/torch_install.py

(PYTHONPATH: where the build put fabpool_torch.py and libfabpool_torch.so.)
Needs PyTorch and a GPU; exits 77 (skipped) with the reason where either is
missing."""
import sys

from need_torch import need_torch   # exits 77 (skipped) with the reason where PyTorch or a GPU is missing

torch = need_torch()

import fabpool_torch

# 1. Before any CUDA tensor.  stats=True: torch.cuda.memory_stats() and friends answer from fabpool also where
#    install() had to fall back to PyTorch's pluggable interface (it warns once if so).
fabpool_torch.install(stats=True)
print("fabpool serves PyTorch as", fabpool_torch.installed())   # "cxx", or "shim" (the pluggable interface)

# 2. The program as it is.
x = torch.randn(4096, 4096, device="cuda")
y = x @ x
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    z = torch.empty(1 << 20, device="cuda")     # allocated for the side stream
    z.fill_(1.0)
torch.cuda.current_stream().wait_stream(side)
total = float(y.sum()) + float(z.sum())
print("allocated %.1f MiB, reserved %.1f MiB" % (torch.cuda.memory_allocated() / 2**20,
                                                torch.cuda.memory_reserved() / 2**20))

# 3. What the pool holds, from fabpool.
pool = fabpool_torch.stats(0)["pool"]
print("fabpool maps %.1f MiB, %.1f MiB in use" % (pool["mapped_bytes"] / 2**20, pool["in_use_bytes"] / 2**20))

# 4. Free the tensors and give the cached memory back to the driver.
del x, y, z
torch.cuda.synchronize()
torch.cuda.empty_cache()
after = fabpool_torch.stats(0)["pool"]["mapped_bytes"]
print("after empty_cache: fabpool maps %.1f MiB" % (after / 2**20))
if total != total or pool["mapped_bytes"] == 0 or after >= pool["mapped_bytes"]:
    print("FAILED: the pool did not hold the tensors, or empty_cache gave nothing back")
    sys.exit(1)
print("done")

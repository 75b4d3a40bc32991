"""Sleep and wake by tag, as RL frameworks and inference servers do between
phases.

Each tag is a pool of its own: here "weights" (offloaded to pinned host
memory while asleep, restored at wake) and "kv" (dropped: its contents are
undefined after wake).  Tensors keep their addresses (data_ptr) throughout,
so CUDA graphs captured over them stay valid.

    PYTHONPATH=build/adapters/torch python3 examples/torch_sleep_wake.py

Needs PyTorch and a GPU; exits 77 (skipped) with the reason where either is
missing."""
import sys

from need_torch import need_torch   # exits 77 (skipped) with the reason where PyTorch or a GPU is missing

torch = need_torch(mempool=True)

import fabpool_torch

weights_pool = fabpool_torch.mempool(tag="weights")
kv_pool = fabpool_torch.mempool(tag="kv")
with torch.cuda.use_mem_pool(weights_pool):
    w = torch.arange(1 << 24, dtype=torch.float32, device="cuda")
with torch.cuda.use_mem_pool(kv_pool):
    kv = torch.zeros(1 << 24, dtype=torch.float32, device="cuda")
ptr = w.data_ptr()
expect = float(w.sum())

free_awake = torch.cuda.mem_get_info()[0]
state = fabpool_torch.sleep(tags=["weights", "kv"], offload={"weights"})   # waits for the GPU work first
free_asleep = torch.cuda.mem_get_info()[0]
print("asleep: %.0f MiB offloaded, %.0f MiB dropped, %.0f MiB more free on the device (other processes too)" % (
    state["weights"]["offloaded_bytes"] / 2**20, state["kv"]["discarded_bytes"] / 2**20,
    (free_asleep - free_awake) / 2**20))

fabpool_torch.wake()               # every sleeping tag of the device
kv.zero_()                         # a dropped tag's contents are undefined after wake: set them again
same = w.data_ptr() == ptr and float(w.sum()) == expect
print("woken: weights at the same address and restored:", same)
# what sleep gave back is the tags' own count: the device's free memory moves with every other process on it
if not same or state["weights"]["offloaded_bytes"] == 0 or state["kv"]["discarded_bytes"] == 0:
    print("FAILED: sleep gave nothing back, or wake did not restore the weights")
    sys.exit(1)
print("done")

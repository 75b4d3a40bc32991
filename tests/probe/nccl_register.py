#!/usr/bin/env python3
"""nccl_register.py - can torch.distributed's NCCL backend register and use a
fabpool-backed tensor?  One GPU, world size 1, no network.

    python3 tests/probe/nccl_register.py --lib <build>/adapters/torch/libfabpool_torch.so --out $OUT

Steps, each printed with its outcome:
  1. init_process_group("nccl", FileStore, world size 1, device_id=cuda:0):
     an eager NCCL communicator (ProcessGroupNCCL.register_mem_pool needs one);
  2. pool = fabpool_torch.mempool(): a torch.cuda.MemPool whose segments come
     from fabpool, with FABPOOL_CONF=handle_type:posix_fd (--handle-type);
  3. a tensor allocated in the pool; what the driver says of its memory
     (cuMemRetainAllocationHandle + cuMemGetAllocationPropertiesFromHandle:
     handle types, gpuDirectRDMACapable; a POSIX fd export and a dma-buf of
     its segment: what NCCL's IPC and network registration ask of it);
  4. backend.register_mem_pool(pool) (ncclCommRegister of every segment);
  5. all_reduce on the tensor, the result checked;
  6. deregister, destroy; NCCL's own registration lines (NCCL_DEBUG=INFO,
     NCCL_DEBUG_SUBSYS=INIT,ENV,REG, written to $OUT/nccl-debug-<handle>.txt)
     must name a buffer that holds the tensor.
The last line is PASS or FAIL with the reason; the summary also goes to
$OUT/nccl_register-<handle>.json.  Exit status 0 on PASS.

With --handle-type none the same steps show what a pool of handle type none
gives NCCL: the driver refuses the POSIX fd export that NCCL's IPC
registration (world size > 1, peers on the host) needs.
"""
import argparse
import ctypes
import json
import os
import re
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--lib", required=True, help="libfabpool_torch.so")
ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/nccl-register-out"))
ap.add_argument("--handle-type", default="posix_fd", choices=["posix_fd", "none", "fabric", "auto"])
ap.add_argument("--numel", type=int, default=8 << 20, help="float32 elements of the tensor (default 32 MiB)")
ap.add_argument("--symm", action="store_true", help="also try register_mem_pool(pool, symm=True) at the end")
args = ap.parse_args()
os.makedirs(args.out, exist_ok=True)
tag = args.handle_type
debug_file = os.path.join(args.out, "nccl-debug-%s.txt" % tag)
if os.path.exists(debug_file):
    os.unlink(debug_file)

# before torch and NCCL read them
os.environ["FABPOOL_CONF"] = "handle_type:%s" % args.handle_type + (
    "," + os.environ["FABPOOL_CONF_EXTRA"] if os.environ.get("FABPOOL_CONF_EXTRA") else "")
os.environ["NCCL_DEBUG"] = "INFO"
os.environ["NCCL_DEBUG_SUBSYS"] = "INIT,ENV,REG"
os.environ["NCCL_DEBUG_FILE"] = debug_file

summary = {"handle_type": args.handle_type, "steps": []}
verdict = {"pass": False, "reason": "did not finish"}


def step(name, ok, detail=""):
    print("%-44s %s%s" % (name, "ok" if ok else "FAILED", ("  " + detail) if detail else ""), flush=True)
    summary["steps"].append({"step": name, "ok": bool(ok), "detail": detail})


def finish(passed, reason):
    verdict["pass"], verdict["reason"] = passed, reason
    summary["verdict"] = verdict
    with open(os.path.join(args.out, "nccl_register-%s.json" % tag), "w") as f:
        json.dump(summary, f, indent=1)
    print("%s (handle_type %s): %s" % ("PASS" if passed else "FAIL", tag, reason), flush=True)


here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "..", "adapters", "torch", "python"))
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import fabpool_torch  # noqa: E402

print("torch %s, cuda %s, nccl %s, device %s" % (torch.__version__, torch.version.cuda,
      ".".join(map(str, torch.cuda.nccl.version())), torch.cuda.get_device_name(0)), flush=True)
summary["torch"], summary["nccl"] = torch.__version__, ".".join(map(str, torch.cuda.nccl.version()))

# --- the driver, for what it says of the tensor's memory
cu = ctypes.CDLL("libcuda.so.1")


class CUmemAllocationProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("win32HandleMetaData", ctypes.c_void_p),
                ("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


def cu_name(r):
    s = ctypes.c_char_p()
    cu.cuGetErrorName(r, ctypes.byref(s))
    return s.value.decode() if s.value else str(r)


def driver_view(ptr, seg_base, seg_size):
    """Handle types and RDMA flag of the memory at ptr; a POSIX fd export; a dma-buf of its segment."""
    out = {}
    h = ctypes.c_uint64(0)
    r = cu.cuMemRetainAllocationHandle(ctypes.byref(h), ctypes.c_void_p(ptr))
    out["retain"] = cu_name(r)
    if r != 0:
        return out
    p = CUmemAllocationProp()
    r = cu.cuMemGetAllocationPropertiesFromHandle(ctypes.byref(p), h)
    out["props"] = cu_name(r)
    out["requestedHandleTypes"] = p.requestedHandleTypes
    out["gpuDirectRDMACapable"] = p.gpuDirectRDMACapable
    fd = ctypes.c_int(-1)
    r = cu.cuMemExportToShareableHandle(ctypes.byref(fd), h, 1, ctypes.c_ulonglong(0))  # POSIX_FILE_DESCRIPTOR
    out["export_posix_fd"] = cu_name(r)
    if r == 0 and fd.value >= 0:
        os.close(fd.value)
    cu.cuMemRelease(h)
    fd = ctypes.c_int(-1)
    r = cu.cuMemGetHandleForAddressRange(ctypes.byref(fd), ctypes.c_uint64(seg_base), ctypes.c_size_t(seg_size), 1,
                                         ctypes.c_ulonglong(0))  # DMA_BUF_FD
    out["dmabuf_of_segment"] = cu_name(r)
    if r == 0 and fd.value >= 0:
        out["dmabuf_size"] = os.lseek(fd.value, 0, os.SEEK_END)
        os.close(fd.value)
    return out


def nccl_lines():
    try:
        with open(debug_file) as f:
            return f.read().splitlines()
    except OSError:
        return []


try:
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    store_path = tempfile.mktemp(prefix="fabpool-nccl-store-")
    t0 = time.time()
    dist.init_process_group("nccl", store=dist.FileStore(store_path, 1), rank=0, world_size=1, device_id=dev)
    step("init_process_group(nccl, world size 1)", True, "%.1f s" % (time.time() - t0))
    backend = dist.group.WORLD._get_backend(dev)

    pool = fabpool_torch.mempool(device=0, path=args.lib)
    with torch.cuda.use_mem_pool(pool):
        x = torch.arange(args.numel, dtype=torch.float32, device=dev)
    torch.cuda.synchronize()
    ptr = x.data_ptr()
    fst = fabpool_torch.stats(0)["pool"]
    try:
        snap = pool.snapshot(include_traces=False)
    except (AttributeError, TypeError):
        snap = [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == tuple(pool.id)]
    segs = [s for s in snap if s["address"] <= ptr < s["address"] + s["total_size"]]
    seg_base, seg_size = (segs[0]["address"], segs[0]["total_size"]) if segs else (ptr, x.numel() * 4)
    step("tensor in a fabpool MemPool", fst.get("mapped_bytes", 0) > 0 and bool(segs),
         "data_ptr 0x%x, segment 0x%x + %d MiB; fabpool pool: handle_type %s, %d MiB mapped"
         % (ptr, seg_base, seg_size >> 20, fst.get("handle_type"), fst.get("mapped_bytes", 0) >> 20))
    summary["fabpool_pool"] = {k: fst.get(k) for k in ("handle_type", "mapped_bytes")}
    dv = driver_view(ptr, seg_base, seg_size)
    summary["driver"] = dv
    step("the driver's view of the tensor's memory", dv.get("props") == "CUDA_SUCCESS", json.dumps(dv))

    t0 = time.time()
    reg_error = None
    try:
        backend.register_mem_pool(pool)
    except Exception as e:  # noqa: BLE001 - the reason is the result
        reg_error = "%s: %s" % (type(e).__name__, e)
    step("backend.register_mem_pool(pool)", reg_error is None, reg_error or "%.2f s" % (time.time() - t0))

    expect = x.clone()
    dist.all_reduce(x)
    torch.cuda.synchronize()
    correct = torch.equal(x, expect)  # one rank: the sum is the tensor itself
    step("all_reduce on the tensor", correct, "sum of %d floats %s" % (x.numel(), "correct" if correct else "WRONG"))
    x.mul_(2)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    correct2 = torch.equal(x, expect * 2)
    step("all_reduce again after a write", correct2)

    if reg_error is None:
        try:
            backend.deregister_mem_pool(pool)
            step("backend.deregister_mem_pool(pool)", True)
        except Exception as e:  # noqa: BLE001
            step("backend.deregister_mem_pool(pool)", False, str(e))

    lines = nccl_lines()
    reg = [ln for ln in lines if re.search(r"regist", ln, re.I)]
    covering = []
    for ln in reg:
        m = re.search(r"register comm \S+ buffer (0x[0-9a-fA-F]+) size (\d+)", ln)
        if m:
            b, n = int(m.group(1), 16), int(m.group(2))
            if b <= ptr < b + n:
                covering.append(ln.strip())
    skipped = [ln.strip() for ln in reg if "Skipping registration" in ln]
    print("NCCL registration lines (%d of %d debug lines, %s):" % (len(reg), len(lines), debug_file))
    for ln in reg[:40]:
        print("  " + ln.strip())
    summary["nccl_registration_lines"] = reg[:200]
    step("an NCCL registration line names the tensor's buffer", bool(covering),
         covering[0] if covering else (skipped[0] if skipped else "no 'register comm ... buffer' line covers 0x%x" % ptr))

    if args.symm:
        try:
            backend.register_mem_pool(pool, symm=True)
            step("register_mem_pool(pool, symm=True) (window registration)", True)
            backend.deregister_mem_pool(pool)
        except Exception as e:  # noqa: BLE001
            step("register_mem_pool(pool, symm=True) (window registration)", False, "%s: %s" % (type(e).__name__, e))

    del x, expect
    dist.destroy_process_group()
    if reg_error:
        finish(False, "ProcessGroupNCCL.register_mem_pool raised " + reg_error)
    elif not (correct and correct2):
        finish(False, "all_reduce on the registered fabpool tensor gave a wrong result")
    elif skipped and not covering:
        finish(False, "NCCL skipped the registration: " + skipped[0])
    elif not covering:
        finish(False, "NCCL printed no registration line for the tensor's buffer (NCCL_DEBUG_SUBSYS=REG); "
                      "see %s" % debug_file)
    else:
        why = "NCCL registered the fabpool segment (%s) and all_reduce on it is correct" % covering[0].split("NCCL INFO")[-1].strip()
        if args.handle_type == "none" and dv.get("export_posix_fd") != "CUDA_SUCCESS":
            why += "; but the driver refuses to export its memory as a POSIX fd (%s), which NCCL's IPC " \
                   "registration with peers on the host needs: use handle_type:posix_fd" % dv.get("export_posix_fd")
        finish(True, why)
except Exception as e:  # noqa: BLE001
    import traceback
    traceback.print_exc()
    finish(False, "%s: %s" % (type(e).__name__, e))
sys.exit(0 if verdict["pass"] else 1)

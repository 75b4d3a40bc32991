"""held.py - how much device memory this process uses, for the PyTorch checks on a real GPU.

torch.cuda.mem_get_info() tells the whole device's free memory: another process that allocates meanwhile moves
it. NVML (pynvml, where installed) tells each process's used memory, so the checks compare what this process
and its children use. own_free(device) is the device's total memory less that use: it rises by what this
process gives back, whatever other processes do. Where NVML cannot say (no pynvml, or a PID namespace hides the
process), it is torch.cuda.mem_get_info()[0], and `source` says so: the check then needs a quiet GPU.
"""
import os

import torch

source = None  # "nvml (this process tree)" or "mem_get_info (whole device)", after the first call


def _under(pid, root):
    """pid is root or a descendant of it (its parent chain in /proc)."""
    for _ in range(64):
        if pid == root:
            return True
        if pid <= 1:
            return False
        try:
            with open("/proc/%d/stat" % pid) as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def _nvml_used(device):
    try:
        import pynvml
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(("GPU-" + uuid) if not uuid.startswith("GPU-") else uuid)
        me = os.getpid()
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    except Exception:  # no pynvml, no NVML, or a device it does not know
        return None
    mine = [p for p in procs if _under(p.pid, me)]
    if not any(p.pid == me for p in mine):
        return None
    return sum(p.usedGpuMemory or 0 for p in mine)


def own_free(device=0):
    """The device's total memory less what this process (and its children) use, in bytes."""
    global source
    if os.environ.get("FABPOOL_TEST_NO_NVML") is None:
        used = _nvml_used(device)
        if used is not None:
            source = "nvml (this process tree)"
            return torch.cuda.get_device_properties(device).total_memory - used
    source = "mem_get_info (whole device)"
    return torch.cuda.mem_get_info(device)[0]

"""What libfabpool_torch_cxx.so is built against: the PyTorch that this python3 imports.  Prints key=value lines
(include folders, comma-separated; lib; the C++11 ABI flag; torch.__version__; CUDA; the libcudart that torch
loaded, so that the library uses the same CUDA runtime).  Exits 1 where torch cannot be imported or has no CUDA."""
import os
import sys

try:
    import torch
except Exception as e:  # not installed, or broken: the caller skips the target
    print("torch cannot be imported: %s" % e, file=sys.stderr)
    sys.exit(1)
if not torch.version.cuda:
    print("torch %s has no CUDA" % torch.__version__, file=sys.stderr)
    sys.exit(1)
root = os.path.dirname(torch.__file__)
inc = [os.path.join(root, "include"), os.path.join(root, "include", "torch", "csrc", "api", "include")]
print("include=" + ",".join(inc))
print("lib=" + os.path.join(root, "lib"))
print("abi=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI))
print("version=" + torch.__version__)
print("cuda=" + torch.version.cuda)
cudart = ""
try:
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "/libcudart.so" in path:
                cudart = path
                break
except OSError:
    pass
print("cudart=" + cudart)

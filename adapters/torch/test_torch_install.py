"""fabpool_torch.install(): the C++ allocator where its library loads and was built against this PyTorch, else
the pluggable shim with one warning that names what does not work then.  No PyTorch here: a stand-in module
records what install() asks of torch, and a stand-in C++ library (test_torch_cxx_stub.c: the shim's functions and
entry points that record their calls) plays libfabpool_torch_cxx.so.  Each case runs in a process of its own
(install() works once per process).  Usage:
test_torch_install.py <libfabpool_torch.so> <stub library>"""
import os
import subprocess
import sys
import types
import warnings


def fake_torch():
    torch = types.ModuleType("torch")
    torch.__version__ = "2.11.0+cu130"
    torch.cuda = types.ModuleType("torch.cuda")
    torch.cuda.memory = types.ModuleType("torch.cuda.memory")
    torch.calls = []

    class CUDAPluggableAllocator:
        def __init__(self, path, alloc, free):
            torch.calls.append(("pluggable", os.path.basename(path), alloc, free))

    torch.cuda.memory.CUDAPluggableAllocator = CUDAPluggableAllocator
    torch.cuda.memory.change_current_allocator = lambda a: torch.calls.append(("change_current_allocator",))
    torch.cuda.memory.memory_stats = lambda device=None: {"from": "torch", "device": device}
    torch.cuda.memory.reset_peak_memory_stats = lambda device=None: torch.calls.append(("reset_peak", device))
    torch.cuda.empty_cache = lambda: torch.calls.append(("empty_cache",))
    sys.modules["torch"] = torch
    return torch


def run_case(case, shim):
    """One case in this process; exits 1 on a failed check."""
    torch = fake_torch()
    sys.path.insert(0, os.path.dirname(shim))
    import fabpool_torch
    failed = []

    def check(cond, what):
        print(("PASS " if cond else "FAIL ") + case + ": " + what)
        if not cond:
            failed.append(what)

    def install_twice(**kw):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fabpool_torch.install(shim, **kw)
            fabpool_torch.install(shim, **kw)
        return [str(x.message) for x in w if issubclass(x.category, RuntimeWarning)]

    if case == "no_cxx_library":
        msgs = install_twice()
        check(len(msgs) == 1, "one warning for two installs (%d)" % len(msgs))
        text = msgs[0] if msgs else ""
        check("libfabpool_torch_cxx.so was not found" in text, "the warning says why")
        check(all(limit in text for limit in fabpool_torch.SHIM_LIMITS) and "record_stream" in text and
              "OutOfMemoryError" in text and "reduce-overhead" in text and "multiprocessing" in text,
              "the warning names what does not work with the shim")
        check(torch.calls == [("pluggable", "libfabpool_torch.so", "fabpool_torch_alloc_raising", "fabpool_torch_free"),
                              ("change_current_allocator",)], "the shim went in through the pluggable allocator")
        check(fabpool_torch.installed() == "shim", "installed() says shim")
    elif case == "cxx_required":
        try:
            fabpool_torch.install(shim)
            check(False, "mode cxx without the library raises")
        except fabpool_torch.FabpoolError as e:
            check("mode='cxx'" in str(e) and "was not found" in str(e), "the error says why (%s)" % e)
        check(torch.calls == [] and fabpool_torch.installed() is None, "nothing installed")
    elif case == "cxx":
        msgs = install_twice()
        check(msgs == [], "no warning")
        check(fabpool_torch.installed() == "cxx", "installed() says cxx")
        check(torch.calls == [], "the pluggable allocator was not used")
        lib = fabpool_torch.load()
        check(lib.fabpool_torch_cxx_installed() == 1, "the C++ library's install ran once")
        check(os.path.basename(fabpool_torch._lib_path) == os.path.basename(os.environ["FABPOOL_TORCH_CXX_LIBRARY"]),
              "the module's functions call the C++ library")
        check(fabpool_torch.counters(0)["allocs"] == 0, "the shim's functions of the C++ library answer")
        check(fabpool_torch.cpp_view(1)["allocated"] == 10, "cpp_view reads the C++ library")
        check(fabpool_torch.memory_stats(3) == {"from": "torch", "device": 3}, "memory_stats() is PyTorch's own")
        fabpool_torch.reset_peak_memory_stats(2)
        fabpool_torch.empty()
        check(torch.calls == [("reset_peak", 2), ("empty_cache",)], "reset and empty are PyTorch's own")
        fabpool_torch.patch_torch_stats(torch)
        check(torch.cuda.memory.memory_stats(5)["from"] == "torch", "patch_torch_stats leaves PyTorch's functions")
    elif case == "cxx_other_torch":
        msgs = install_twice()
        text = msgs[0] if len(msgs) == 1 else ""
        check("built against PyTorch 2.10.0+cu128, and this is PyTorch 2.11.0+cu130" in text,
              "a library of another PyTorch: the warning names both")
        check(fabpool_torch.installed() == "shim" and ("change_current_allocator",) in torch.calls,
              "the shim instead")
    elif case == "shim_chosen":
        msgs = install_twice(mode="shim")
        check(msgs == [] and fabpool_torch.installed() == "shim", "mode shim: the shim, no warning")
    elif case == "cxx_refused":
        try:
            fabpool_torch.install(shim)
            check(False, "a refusal raises")
        except fabpool_torch.FabpoolError as e:
            check("the stub refuses" in str(e), "the library's reason is passed on (%s)" % e)
        check(fabpool_torch.installed() is None and torch.calls == [], "nothing installed")
    else:
        check(False, "unknown case")
    sys.exit(1 if failed else 0)


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "--case":
        return run_case(sys.argv[2], sys.argv[3])
    shim, stub = sys.argv[1], sys.argv[2]
    missing = os.path.join(os.path.dirname(stub), "no-such-library.so")
    cases = [
        ("no_cxx_library", {"FABPOOL_TORCH_CXX_LIBRARY": missing}),
        ("cxx_required", {"FABPOOL_TORCH_CXX_LIBRARY": missing, "FABPOOL_TORCH_MODE": "cxx"}),
        ("cxx", {"FABPOOL_TORCH_CXX_LIBRARY": stub}),
        ("cxx_other_torch", {"FABPOOL_TORCH_CXX_LIBRARY": stub, "FABPOOL_STUB_TORCH_VERSION": "2.10.0+cu128"}),
        ("shim_chosen", {"FABPOOL_TORCH_CXX_LIBRARY": stub}),
        ("cxx_refused", {"FABPOOL_TORCH_CXX_LIBRARY": stub, "FABPOOL_STUB_REFUSE": "1"}),
    ]
    bad = 0
    for case, env in cases:
        e = dict(os.environ)
        for k in ("FABPOOL_TORCH_MODE", "FABPOOL_STUB_TORCH_VERSION", "FABPOOL_STUB_REFUSE"):
            e.pop(k, None)
        e.update(env)
        r = subprocess.run([sys.executable, __file__, "--case", case, shim], env=e)
        bad += r.returncode != 0
    print("%d of %d cases failed" % (bad, len(cases)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

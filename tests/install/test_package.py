"""The fabpool_torch package where it was installed (cmake --install, or the
wheel), not the build folder's: the module is under ROOT, finds the library
installed beside it by itself, says its version and build id and the
library says the same; a copy of that library that says another build id is
refused, with a message that names both builds, and nothing is loaded.
Needs no GPU (the driver of FABPOOL_CUDA_LIBRARY; nothing is allocated).
Usage: test_package.py ROOT VERSION"""
import os
import shutil
import subprocess
import sys
import tempfile

import fabpool_torch

failures = []


def check(cond, what):
    print(("ok: " if cond else "FAILED: ") + what)
    if not cond:
        failures.append(what)


def under(path, root):
    return os.path.realpath(path).startswith(os.path.realpath(root) + os.sep)


REFUSED = r"""
import sys, fabpool_torch
try:
    fabpool_torch.load(sys.argv[1])
except fabpool_torch.FabpoolError as e:
    print(e)
    sys.exit(3 if fabpool_torch.build_info().get("library") is None else 4)
sys.exit(0)
"""


def main():
    root, version = sys.argv[1], sys.argv[2]
    here = os.path.dirname(os.path.abspath(fabpool_torch.__file__))
    check(under(fabpool_torch.__file__, root), "the module %s is the one installed under %s" %
          (fabpool_torch.__file__, root))
    check(os.path.basename(fabpool_torch.__file__) == "__init__.py", "fabpool_torch is a package")
    check(fabpool_torch.__version__ == version, "__version__ %r is the project's %s" % (fabpool_torch.__version__,
                                                                                       version))
    info = fabpool_torch.build_info()
    check(info["version"] == version and info["build_id"], "the module says its build: %s" % info)
    lib_path = fabpool_torch.library_path()
    check(os.path.dirname(lib_path) == here, "the library %s is found beside the module" % lib_path)
    fabpool_torch.load()
    info = fabpool_torch.build_info()
    check(info["library_version"] == version and info["library_build_id"] == info["build_id"],
          "the library is the module's build: %s" % info)

    # the library of another build: the installed one with its build id changed in its bytes
    with tempfile.TemporaryDirectory() as tmp:
        other = os.path.join(tmp, "libfabpool_torch.so")
        shutil.copy(lib_path, other)
        with open(other, "rb") as f:
            data = f.read()
        own = info["build_id"].encode()
        check(data.count(own) == 1, "the build id appears once in the library")
        swapped = own[::-1] if own[::-1] != own else b"x" * len(own)
        with open(other, "wb") as f:
            f.write(data.replace(own, swapped))
        r = subprocess.run([sys.executable, "-c", REFUSED, other], capture_output=True, text=True, timeout=60)
        msg = r.stdout + r.stderr
        check(r.returncode == 3, "a library of another build is refused and not loaded (exit %d: %s)" %
              (r.returncode, msg.strip()))
        check(swapped.decode() in msg and own.decode() in msg and "one build" in msg,
              "the refusal names both builds and says what to do: %s" % msg.strip())
    print("test_package: " + ("%d FAILED" % len(failures) if failures else
                              "the installed module, its library, and the build check"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

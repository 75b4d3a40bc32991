"""The fabpool-torch wheel says what it holds, and a build that would lose the C++ allocator unasked stops.

    test_wheel_variants.py PYTHON --wheel WHEEL      a wheel built by PYTHON (CI's, adapters/torch/wheel.sh):
                                                     its name, METADATA and build_info() say the allocator that
                                                     PYTHON's torch (or its absence) gives
    test_wheel_variants.py PYTHON --fake-torch       three builds by PYTHON of the repository, with the documented
                                                     command (pip wheel --no-build-isolation --no-index), where a
                                                     stand-in `torch` package on PYTHONPATH makes the build see a
                                                     PyTorch 2.5.1+cu124 it cannot build the C++ allocator against:
      - the build stops, no wheel is made, and the message names the PyTorch, the C++ allocator and
        FABPOOL_WHEEL_SHIM_ONLY=1;
      - with FABPOOL_WHEEL_SHIM_ONLY=1 the wheel is 0.4.0+shim, its METADATA says "the pluggable shim only" and
        "on purpose", and its module's build_info() says no C++ allocator;
      - with a stand-in torch without CUDA the build stops before building, naming why.
Every wheel is read back: the file name's version, METADATA's Version and Summary, the files in it (the C++
allocator's library, the simulated driver), and build_info() of the module unpacked from it.  Needs CMake, a C
compiler and the CUDA headers, as the wheel's build does; no GPU.  Exit 0 when every check holds."""
import argparse
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
failures = []


def check(cond, what):
    print(("ok: " if cond else "FAILED: ") + what, flush=True)
    if not cond:
        failures.append(what)


def project_version():
    with open(os.path.join(ROOT, "pyproject.toml")) as f:
        return re.search(r'^version = "([^"]+)"', f.read(), re.M).group(1)


BUILD_INFO = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import fabpool_torch
print(json.dumps(fabpool_torch.build_info()))
"""


def read_wheel(path, python):
    """(version from the file name, METADATA's headers, the names in the zip, build_info() of its module)"""
    name = os.path.basename(path)
    m = re.match(r"^fabpool_torch-([^-]+)-py3-none-linux_[a-z0-9_]+\.whl$", name)
    check(m is not None, "the wheel's file name %s is fabpool_torch-<version>-py3-none-linux_<arch>.whl" % name)
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        for mod in ("fabpool_symm.py", "fabpool_memory_saver.py", "fabpool_cumem.py", "fabpool_stage.py"):
            check(mod in names, "the wheel holds %s at its root" % mod)
        meta_name = [n for n in names if n.endswith(".dist-info/METADATA")]
        check(len(meta_name) == 1, "the wheel has one METADATA: %s" % meta_name)
        meta = email.parser.HeaderParser().parsestr(z.read(meta_name[0]).decode()) if meta_name else {}
        with tempfile.TemporaryDirectory() as tmp:
            z.extractall(tmp)
            for n in names:   # zipfile keeps no modes: the libraries are loaded, the rest need not run
                if n.endswith(".so") or ".so." in n:
                    os.chmod(os.path.join(tmp, n), 0o755)
            r = subprocess.run([python, "-c", BUILD_INFO, tmp], capture_output=True, text=True, timeout=120,
                               cwd=tmp, env=dict(os.environ, PYTHONPATH=""))
            check(r.returncode == 0, "the wheel's module imports and answers build_info(): %s" %
                  (r.stdout.strip() or r.stderr.strip()[-800:]))
            info = json.loads(r.stdout) if r.returncode == 0 else {}
            if info.get("sim_driver"):
                info["sim_driver"] = os.path.relpath(info["sim_driver"], tmp)
    return (m.group(1) if m else None), meta, names, info


def expect_shim(path, python, asked):
    version, meta, names, info = read_wheel(path, python)
    want = project_version() + "+shim"
    check(version == want, "the file name's version %s is %s" % (version, want))
    check(meta.get("Version") == want, "METADATA's Version %s is %s" % (meta.get("Version"), want))
    summary = meta.get("Summary", "")
    check("the pluggable shim only, without the C++ allocator" in summary,
          "METADATA's Summary says the shim only: %r" % summary)
    why = "built so on purpose, FABPOOL_WHEEL_SHIM_ONLY=1" if asked else "the Python that built it had no torch"
    check(why in summary, "METADATA's Summary says why: %r" % why)
    check("fabpool_torch/libfabpool_torch.so" in names and "fabpool_torch/libfabpool_torch_cxx.so" not in names,
          "the wheel holds the shim's library and not the C++ allocator's")
    check(info.get("cxx_allocator") is False and info.get("cxx_built_for") is None,
          "build_info() says no C++ allocator: %s" % info)
    check(info.get("version") == project_version() and info.get("build_id"),
          "build_info() says the version and a build id: %s" % info)
    check(info.get("sim_driver") == "fabpool_torch/sim/libcuda.so.1",
          "build_info()'s sim_driver is the wheel's simulated driver: %s" % info.get("sim_driver"))


def expect_cxx(path, python, torch_version, label):
    version, meta, names, info = read_wheel(path, python)
    want = project_version() + "+" + label
    check(version == want, "the file name's version %s is %s" % (version, want))
    check(meta.get("Version") == want, "METADATA's Version %s is %s" % (meta.get("Version"), want))
    summary = meta.get("Summary", "")
    check("with the C++ allocator, built for PyTorch %s" % torch_version in summary,
          "METADATA's Summary names the C++ allocator and PyTorch %s: %r" % (torch_version, summary))
    check("fabpool_torch/libfabpool_torch_cxx.so" in names, "the wheel holds the C++ allocator's library")
    check(info.get("cxx_allocator") is True and info.get("cxx_built_for") == torch_version,
          "build_info() says the C++ allocator, built for PyTorch %s: %s" % (torch_version, info))
    check(info.get("sim_driver") == "fabpool_torch/sim/libcuda.so.1",
          "build_info()'s sim_driver is the wheel's simulated driver: %s" % info.get("sim_driver"))


def torch_of(python):
    """(torch.__version__, torch.version.cuda) of PYTHON's torch, or None where it cannot import one."""
    r = subprocess.run([python, "-c", "import torch; print(torch.__version__); print(torch.version.cuda or '')"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        return None
    lines = r.stdout.splitlines()
    return lines[0], (lines[1] if len(lines) > 1 else "")


FAKE_TORCH = '''"""A stand-in for torch: importable, says a version and a CUDA, has no headers or libraries to build with."""
__version__ = "2.5.1+cu124"


class version:
    cuda = %r


class _C:
    _GLIBCXX_USE_CXX11_ABI = True
'''


def build(python, out, fake_cuda, shim_only):
    """The documented command, by python, of the repository, with a stand-in torch on PYTHONPATH:
    (rc, output, the wheels made)."""
    with tempfile.TemporaryDirectory() as fake:
        os.makedirs(os.path.join(fake, "torch"))
        with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
            f.write(FAKE_TORCH % (fake_cuda,))
        env = dict(os.environ, PYTHONPATH=fake)
        env.pop(SHIM_ENV, None)
        if shim_only:
            env[SHIM_ENV] = "1"
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
        cmd = [python, "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-index", "--no-deps", "-w", out]
        print("+ PYTHONPATH=<stand-in torch>%s %s" % (" %s=1" % SHIM_ENV if shim_only else "", " ".join(cmd)),
              flush=True)
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    wheels = sorted(os.path.join(out, w) for w in os.listdir(out) if w.endswith(".whl"))
    return r.returncode, r.stdout + r.stderr, wheels


SHIM_ENV = "FABPOOL_WHEEL_SHIM_ONLY"


def fake_torch_builds(python):
    with tempfile.TemporaryDirectory() as work:
        out = os.path.join(work, "dist")
        # a torch with CUDA that the C++ allocator cannot be built against (no headers, no libraries)
        rc, text, wheels = build(python, out, "12.4", shim_only=False)
        check(rc != 0 and not wheels, "a torch the C++ allocator fails to build against stops the build, no wheel "
                                      "made (rc %d, %s)" % (rc, wheels))
        check("the C++ allocator (libfabpool_torch_cxx.so) failed to build against PyTorch 2.5.1+cu124" in text and
              SHIM_ENV + "=1" in text, "the message names the C++ allocator, the PyTorch and %s=1" % SHIM_ENV)
        check("torch_cxx.cpp" in text and "Built target fabpool_torch\n" in text,
              "the shim was built and the C++ allocator's compile (torch_cxx.cpp) is what failed")
        if failures:
            print(text[-4000:])
        # the same, the shim only asked for
        rc, text, wheels = build(python, out, "12.4", shim_only=True)
        check(rc == 0 and len(wheels) == 1, "with %s=1 the build makes one wheel (rc %d, %s)" % (SHIM_ENV, rc, wheels))
        if rc != 0:
            print(text[-4000:])
        if wheels:
            expect_shim(wheels[0], python, asked=True)
        # a torch without CUDA: stops before building anything
        rc, text, wheels = build(python, out, None, shim_only=False)
        check(rc != 0 and not wheels, "a torch without CUDA stops the build, no wheel made (rc %d)" % rc)
        check("has a torch, but fabpool's C++ allocator cannot be built against it: torch 2.5.1+cu124 has no CUDA"
              in text and SHIM_ENV + "=1" in text, "the message says the torch has no CUDA and names %s=1" % SHIM_ENV)
        check("cmake --build" not in text, "nothing was built")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("python")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--wheel")
    g.add_argument("--fake-torch", action="store_true")
    a = ap.parse_args()
    if a.wheel:
        torch = torch_of(a.python)
        if torch is None:
            print("%s imports no torch: the wheel must be the shim only, and say so" % a.python)
            expect_shim(a.wheel, a.python, asked=os.environ.get(SHIM_ENV) == "1")
        else:
            print("%s imports torch %s (CUDA %s): the wheel must hold the C++ allocator" % (a.python, *torch))
            label = _label_of(*torch)
            expect_cxx(a.wheel, a.python, torch[0], label)
    else:
        fake_torch_builds(a.python)
    print("test_wheel_variants: " + ("%d FAILED" % len(failures) if failures else "every check holds"))
    return 1 if failures else 0


def _label_of(torch_version, cuda):
    """The label wheel_build.local_label gives, computed here again so that the test does not take it on trust:
    torch + the version's alphanumeric runs, with the CUDA where the version names none."""
    v = torch_version.lower()
    if "+" not in v and cuda:
        v += "+cu" + cuda.replace(".", "")
    return "torch" + ".".join(s for s in re.split(r"[^a-z0-9]+", v) if s)


if __name__ == "__main__":
    sys.exit(main())

"""setuptools commands of the fabpool-torch wheel (pyproject.toml).

Build configures the whole project with CMake in a fresh folder (no tests,
the torch probe run by this interpreter), builds the target fabpool_python
(libfabpool_torch.so, and libfabpool_torch_cxx.so where this interpreter
imports torch) and the simulated driver, and installs the CMake component
"python" into the wheel's root: the package fabpool_torch (module and
libraries, configured by one build, and sim/libcuda.so.1, the simulated
driver, to try it without a GPU) and the modules beside it.
$FABPOOL_CMAKE_ARGS adds arguments to the configure step;
$CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs.

Which allocator the wheel holds follows the Python that builds it, and the
wheel says which in its version, a PEP 440 local label (the file name, the
METADATA's Version and Summary, `pip show`), as PyTorch's own wheels say
their CUDA (2.5.1+cu124):
  torch importable, with CUDA:  the C++ allocator, built against that torch:
                                0.4.0+torch2.5.1.cu124; a build that cannot
                                make it stops, saying why
  torch not importable:         the pluggable shim only: 0.4.0+shim, said at
                                build time, with how to get the C++ allocator
  FABPOOL_WHEEL_SHIM_ONLY=1:    the shim only, by choice, whatever torch is
                                there: 0.4.0+shim
A local label, not a build tag: a build tag must start with a digit and only
orders rebuilds of one version, where the label names the variant, and
`pip install fabpool-torch==0.4.0` still accepts every variant of 0.4.0.
An sdist has no label (it builds either variant).

BdistWheel makes it a platform wheel tagged py3-none-<platform>: it holds
native libraries, which the module loads with ctypes, and no extension module
of a Python ABI.
"""
import glob
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from setuptools.command.egg_info import egg_info as _egg_info
try:
    from setuptools.command.build import build as _build
except ImportError:   # setuptools older than 62.4
    from distutils.command.build import build as _build
try:
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:   # setuptools older than 70.1: the wheel package's
    try:
        from wheel.bdist_wheel import bdist_wheel as _bdist_wheel
    except ImportError:
        sys.exit("fabpool-torch: %s has neither setuptools 70.1 or newer nor the 'wheel' package, one of which "
                 "builds a wheel: install one into it (Debian: apt-get install python3-wheel, for a virtual "
                 "environment made with --system-site-packages)" % sys.executable)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = os.path.join(ROOT, "adapters", "torch", "torch_probe.py")
SHIM_ONLY_ENV = "FABPOOL_WHEEL_SHIM_ONLY"
CXX_LIB = "libfabpool_torch_cxx.so"
HOW_CXX = ("To get the C++ allocator, build the wheel with the Python that imports your torch (with CUDA), "
           "for a virtual environment its own:\n"
           "    /path/to/venv/bin/python -m pip wheel . --no-build-isolation --no-index --no-deps -w dist\n"
           "(docs/pytorch.md, \"Install the wheel\").")


def _run(cmd):
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


def _say(lines):
    """A block that stands out in a build log."""
    bar = "=" * 78
    print("\n".join([bar] + ["fabpool-torch: " + lines[0]] + ["  " + x for x in lines[1:]] + [bar]),
          file=sys.stderr, flush=True)


def _stop(lines):
    _say(lines)
    sys.exit("fabpool-torch: " + lines[0])


def _shim_only_asked():
    v = os.environ.get(SHIM_ONLY_ENV, "")
    if v not in ("", "0", "1"):
        sys.exit("fabpool-torch: %s=%r: 1 builds a wheel with the pluggable shim only, 0 or unset one with the "
                 "C++ allocator where this Python imports torch" % (SHIM_ONLY_ENV, v))
    return v == "1"


def local_label(torch_version, cuda):
    """The PEP 440 local label of a wheel built against torch_version (torch.__version__) and CUDA cuda:
    torch2.5.1.cu124 for 2.5.1+cu124, and for a torch whose version names no CUDA (2.5.1 and CUDA 12.4),
    torch2.5.1.cu124 too.  Lower case, [a-z0-9] segments joined by dots."""
    v = torch_version.strip().lower()
    if "+" not in v and cuda:
        v += "+cu" + re.sub(r"[^0-9]", "", cuda)
    segs = [s for s in re.split(r"[^a-z0-9]+", v) if s]
    return "torch" + ".".join(segs)


_variant = None


def variant():
    """What this build makes, decided once per process (setuptools runs the metadata and the build in one or
    several processes, each deciding alike): {"cxx": bool, "torch": torch.__version__ or None, "label": the
    local version label, "asked": the shim only on purpose, "why" and "summary": why the shim only, for the
    build's log and the wheel's METADATA}.  Stops where torch is there but unusable for the C++
    allocator, unless the shim only was asked."""
    global _variant
    if _variant is not None:
        return _variant
    shim_only = _shim_only_asked()
    if shim_only:
        _variant = {"cxx": False, "torch": None, "label": "shim", "asked": True,
                    "why": "%s=1 asked for the pluggable shim only" % SHIM_ONLY_ENV,
                    "summary": "built so on purpose, %s=1" % SHIM_ONLY_ENV}
    elif importlib.util.find_spec("torch") is None:
        _variant = {"cxx": False, "torch": None, "label": "shim", "asked": False,
                    "why": "%s cannot import torch" % sys.executable,
                    "summary": "the Python that built it had no torch"}
    else:
        r = subprocess.run([sys.executable, PROBE], capture_output=True, text=True, timeout=600)
        keys = dict(line.split("=", 1) for line in r.stdout.splitlines() if "=" in line)
        if r.returncode != 0 or not keys.get("version"):
            _stop(["%s has a torch, but fabpool's C++ allocator cannot be built against it: %s" %
                   (sys.executable, (r.stderr.strip().splitlines() or ["the probe printed no version"])[-1]),
                   "A wheel built here without it would hold only the pluggable shim, which keeps less of "
                   "PyTorch's contract (no record_stream, no torch.OutOfMemoryError, no graph pools).",
                   "Use a torch with CUDA, or build the shim only on purpose: %s=1." % SHIM_ONLY_ENV])
        _variant = {"cxx": True, "torch": keys["version"], "label": local_label(keys["version"], keys.get("cuda")),
                    "asked": False, "why": None, "summary": None}
    return _variant


def _label(dist):
    """The distribution's version and summary say the variant (not for an sdist, which builds either)."""
    if "sdist" in (dist.commands or []) or getattr(dist, "_fabpool_labelled", False):
        return
    v = variant()
    base = dist.metadata.version.split("+", 1)[0]
    dist.metadata.version = "%s+%s" % (base, v["label"])
    summary = dist.metadata.description or ""
    if v["cxx"]:
        dist.metadata.description = "%s; with the C++ allocator, built for PyTorch %s" % (summary, v["torch"])
    else:
        dist.metadata.description = ("%s; the pluggable shim only, without the C++ allocator (%s)" %
                                     (summary, v["summary"]))
    dist._fabpool_labelled = True


def _native(dist):
    """The distribution holds native code: its files go to the wheel's platform root (install_lib runs, the
    build folder is build_platlib), though setuptools sees no extension module."""
    dist.has_ext_modules = lambda: True


class EggInfo(_egg_info):
    def finalize_options(self):
        _label(self.distribution)
        super().finalize_options()


class Build(_build):
    def finalize_options(self):
        _native(self.distribution)
        _label(self.distribution)
        super().finalize_options()

    def initialize_options(self):
        super().initialize_options()
        # not build/: the README's CMake build folder
        self.build_base = os.path.join(ROOT, "build-wheel")

    def run(self):
        super().run()
        v = variant()
        out = os.path.abspath(self.build_lib)
        shutil.rmtree(out, ignore_errors=True)   # nothing of an earlier build goes into this wheel
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        with tempfile.TemporaryDirectory(prefix="fabpool-wheel-") as tmp:
            _run(["cmake", "-S", ROOT, "-B", tmp, "-DBUILD_TESTING=OFF", "-DCMAKE_BUILD_TYPE=Release",
                  "-DFABPOOL_TORCH_PYTHON=" + sys.executable, "-DFABPOOL_INSTALL_PYTHONDIR=.",
                  "-DFABPOOL_TORCH_CXX=" + ("ON" if v["cxx"] else "OFF")] +
                 shlex.split(os.environ.get("FABPOOL_CMAKE_ARGS", "")))
            # the shim and the simulated driver first: a failure there is no matter of torch
            _run(["cmake", "--build", tmp, "--target", "fabpool_torch", "fabsim", "-j", jobs])
            try:
                _run(["cmake", "--build", tmp, "--target", "fabpool_python", "-j", jobs])
            except subprocess.CalledProcessError:
                if not v["cxx"]:
                    raise
                _stop(["the C++ allocator (%s) failed to build against PyTorch %s, which %s imports: the "
                       "compiler's messages above say why." % (CXX_LIB, v["torch"], sys.executable),
                       "No wheel was made: one without it would hold only the pluggable shim, which keeps less "
                       "of PyTorch's contract (no record_stream, no torch.OutOfMemoryError, no graph pools).",
                       "Fix the build (the CUDA toolkit's headers, a C++17 compiler, PyTorch's headers in its "
                       "include/), or build the shim only on purpose: %s=1." % SHIM_ONLY_ENV])
            _run(["cmake", "--install", tmp, "--component", "python", "--prefix", out, "--strip"])
            with tempfile.TemporaryDirectory(prefix="fabpool-wheel-sim-") as sim:
                _run(["cmake", "--install", tmp, "--component", "sim", "--prefix", sim, "--strip"])
                found = glob.glob(os.path.join(sim, "*", "fabpool", "sim", "libcuda.so.1"))
                if len(found) != 1:
                    sys.exit("fabpool-torch: the simulated driver was not installed (found %s)" % found)
                os.makedirs(os.path.join(out, "fabpool_torch", "sim"), exist_ok=True)
                shutil.copy2(found[0], os.path.join(out, "fabpool_torch", "sim", "libcuda.so.1"))
        have = os.path.isfile(os.path.join(out, "fabpool_torch", CXX_LIB))
        if v["cxx"] and not have:
            _stop(["the C++ allocator (%s) was not built, though %s imports PyTorch %s: CMake's configure "
                   "log above says why (fabpool_torch_cxx: ...)." % (CXX_LIB, sys.executable, v["torch"]),
                   "No wheel was made: one without it would hold only the pluggable shim.",
                   "Fix that, or build the shim only on purpose: %s=1." % SHIM_ONLY_ENV])
        if v["cxx"]:
            _say(["this wheel holds the C++ allocator, built for PyTorch %s (version label +%s)." %
                  (v["torch"], v["label"])])
        else:
            _say(["this wheel holds the pluggable shim only, NOT the C++ allocator: %s (version label +shim)." %
                  v["why"],
                  "fabpool_torch.install() then warns and keeps less of PyTorch's contract (no record_stream, "
                  "an out-of-memory error without torch.OutOfMemoryError, no graph pools, no memory_stats "
                  "without install(stats=True))."] + ([] if v["asked"] else HOW_CXX.split("\n")))


class BdistWheel(_bdist_wheel):
    def finalize_options(self):
        _native(self.distribution)
        _label(self.distribution)
        super().finalize_options()

    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])

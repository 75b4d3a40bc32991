"""setuptools commands of the fabpool-torch wheel (pyproject.toml).

Build configures the whole project with CMake in a fresh folder (no tests,
the torch probe run by this interpreter), builds the target fabpool_python
(libfabpool_torch.so, and libfabpool_torch_cxx.so where this interpreter
imports torch) and installs the CMake component "python" into the wheel's
root: the package fabpool_torch (module and libraries, configured by one
build) and fabpool_symm.py.  $FABPOOL_CMAKE_ARGS adds arguments to the
configure step; $CMAKE_BUILD_PARALLEL_LEVEL sets the build's jobs.

BdistWheel makes it a platform wheel tagged py3-none-<platform>: it holds
native libraries, which the module loads with ctypes, and no extension module
of a Python ABI.
"""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

try:
    from setuptools.command.build import build as _build
except ImportError:   # setuptools older than 62.4
    from distutils.command.build import build as _build
try:
    from setuptools.command.bdist_wheel import bdist_wheel as _bdist_wheel
except ImportError:   # setuptools older than 70.1: the wheel package's
    from wheel.bdist_wheel import bdist_wheel as _bdist_wheel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _run(cmd):
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


def _native(dist):
    """The distribution holds native code: its files go to the wheel's platform root (install_lib runs, the
    build folder is build_platlib), though setuptools sees no extension module."""
    dist.has_ext_modules = lambda: True


class Build(_build):
    def finalize_options(self):
        _native(self.distribution)
        super().finalize_options()

    def initialize_options(self):
        super().initialize_options()
        # not build/: the README's CMake build folder
        self.build_base = os.path.join(ROOT, "build-wheel")

    def run(self):
        super().run()
        out = os.path.abspath(self.build_lib)
        shutil.rmtree(out, ignore_errors=True)   # nothing of an earlier build goes into this wheel
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or str(os.cpu_count() or 1)
        with tempfile.TemporaryDirectory(prefix="fabpool-wheel-") as tmp:
            _run(["cmake", "-S", ROOT, "-B", tmp, "-DBUILD_TESTING=OFF", "-DCMAKE_BUILD_TYPE=Release",
                  "-DFABPOOL_TORCH_PYTHON=" + sys.executable, "-DFABPOOL_INSTALL_PYTHONDIR=."] +
                 shlex.split(os.environ.get("FABPOOL_CMAKE_ARGS", "")))
            _run(["cmake", "--build", tmp, "--target", "fabpool_python", "-j", jobs])
            _run(["cmake", "--install", tmp, "--component", "python", "--prefix", out, "--strip"])


class BdistWheel(_bdist_wheel):
    def finalize_options(self):
        _native(self.distribution)
        super().finalize_options()

    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])

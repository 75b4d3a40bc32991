"""Makes the import trees under which torch_memory_saver's and vLLM's own
tests run on fabpool's modules, their test files unchanged:

  OUT/tms/torch_memory_saver/     `import torch_memory_saver` is fabpool_memory_saver; the
                                  checkout's test helpers (utils.py, testing_utils.py) copied beside it
  OUT/vllm/vllm/...               vllm.device_allocator.cumem is fabpool_cumem; vllm.platforms,
                                  vllm.utils.mem_constants and the names the test file imports from vllm
                                  (the engine: its tests are deselected)
  OUT/vllm/tests/utils.py         create_new_process_for_each_test (each test in a forked process, as
                                  vLLM's own) and requires_fp8 (a skip)
  OUT/vllm/tests/basic_correctness/test_cumem.py   copied from VLLM_TESTS

Usage: rl_shims.py OUT TMS_CHECKOUT VLLM_TESTS  (then PYTHONPATH=OUT/tms:<modules> or OUT/vllm:<modules>)
"""
import os
import shutil
import sys

TMS_INIT = '''"""torch_memory_saver, answered by fabpool_memory_saver (adapters/torch/rl_shims.py)."""
from fabpool_memory_saver import TorchMemorySaver, configure_subprocess, torch_memory_saver  # noqa: F401
'''

VLLM_FILES = {
    "vllm/__init__.py": '''"""The names vLLM's test_cumem.py imports; only the allocator is real (fabpool_cumem)."""


class _NoEngine:
    def __init__(self, *a, **kw):
        raise RuntimeError("this vllm is fabpool's test shim: it has no engine")

    @classmethod
    def from_engine_args(cls, *a, **kw):
        return cls()


LLM = SamplingParams = AsyncEngineArgs = AsyncLLMEngine = _NoEngine
''',
    "vllm/device_allocator/__init__.py": "",
    "vllm/device_allocator/cumem.py": "from fabpool_cumem import CuMemAllocator, cumem_available  # noqa: F401\n",
    "vllm/platforms/__init__.py": '''import torch


class _Cuda:
    device_type = "cuda"

    @staticmethod
    def is_rocm():
        return False

    @staticmethod
    def mem_get_info():
        return torch.cuda.mem_get_info()

    @staticmethod
    def get_current_memory_usage():
        free, total = torch.cuda.mem_get_info()
        return total - free


current_platform = _Cuda()
''',
    "vllm/utils/__init__.py": "GiB_bytes = 1 << 30\n",
    "vllm/utils/mem_constants.py": "GiB_bytes = 1 << 30\n",
    "tests/__init__.py": "",
    "tests/basic_correctness/__init__.py": "",
    "tests/utils.py": '''import functools
import os
import sys
import traceback

import pytest


def create_new_process_for_each_test(method=None):
    """Runs the test in a forked process: CUDA starts afresh for each."""
    def deco(f):
        @functools.wraps(f)
        def run(*args, **kwargs):
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    f(*args, **kwargs)
                except BaseException:
                    traceback.print_exc()
                    code = 1
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the test's process failed (%d)" % status
        return run
    return deco


requires_fp8 = pytest.mark.skip(reason="needs vLLM's engine")
''',
}


def main(out, tms_checkout, vllm_tests):
    tms = os.path.join(out, "tms", "torch_memory_saver")
    shutil.rmtree(os.path.join(out, "tms"), ignore_errors=True)
    os.makedirs(tms)
    with open(os.path.join(tms, "__init__.py"), "w") as f:
        f.write(TMS_INIT)
    for helper in ("utils.py", "testing_utils.py"):
        shutil.copy(os.path.join(tms_checkout, "torch_memory_saver", helper), tms)
    root = os.path.join(out, "vllm")
    shutil.rmtree(root, ignore_errors=True)
    for rel, text in VLLM_FILES.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w") as f:
            f.write(text)
    shutil.copy(os.path.join(vllm_tests, "tests", "basic_correctness", "test_cumem.py"),
                os.path.join(root, "tests", "basic_correctness"))
    print("rl_shims: %s/tms and %s/vllm" % (out, out))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])

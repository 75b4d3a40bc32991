#!/usr/bin/env python3
"""run_test.py [--no-bench] - DeepEP's own tests/test_hybrid_ep.py, its
test_main(0, 1, args) in this process (world size 1, as its
`--num-processes 1` would spawn it), with the environment's
MAX_NUM_OF_TOKENS_PER_RANK / NUM_TOKENS_PER_RANK.  Run from the copy's tests/
with the copy, its build dir and the deep_ep_cpp stand-in on PYTHONPATH.
--no-bench replaces test_hybrid_ep_benchmark by nothing (correctness only).
Prints DEEPEP_TEST_PASSED at the end; an assertion of the test exits 1."""
import argparse
import os
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--no-bench", action="store_true")
ap.add_argument("--graphed", action="store_true", help="tests/test_graphed_hybrid_ep.py's test_main instead")
a = ap.parse_args()
t0 = time.time()
import torch  # noqa: E402
import hybrid_ep_cpp  # noqa: E402

print(f"run_test.py: hybrid_ep_cpp from {hybrid_ep_cpp.__file__}; MAX_NUM_OF_TOKENS_PER_RANK="
      f"{os.environ.get('MAX_NUM_OF_TOKENS_PER_RANK')} NUM_TOKENS_PER_RANK={os.environ.get('NUM_TOKENS_PER_RANK')} "
      f"FABPOOL_HYBRIDEP_INPLACE={os.environ.get('FABPOOL_HYBRIDEP_INPLACE', '0')}", flush=True)
if a.graphed:
    import test_graphed_hybrid_ep as t  # noqa: E402
else:
    import test_hybrid_ep as t  # noqa: E402
if a.no_bench and hasattr(t, "test_hybrid_ep_benchmark"):
    t.test_hybrid_ep_benchmark = lambda *args, **kwargs: print("  (benchmark skipped: --no-bench)", flush=True)
t.test_main(0, 1, argparse.Namespace(num_processes=1, nsys_profile=False))
print(f"DEEPEP_TEST_PASSED in {time.time() - t0:.0f} s", flush=True)

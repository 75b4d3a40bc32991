"""FABPOOL_CONF=stats_print:text|json in a program that uses the module and
never destroys its pools (as a PyTorch program does not): each pool's
report is on stderr when the program exits, once, with the options in
force and an in-use peak that is exact (the shim's pools have no thread
caches: a 1 MiB block allocated and freed leaves a peak of 1 MiB).  A
program that calls shutdown() gets the report from the pool's destroy, and
none more at exit.  Each case is a child Python process.
Usage: test_torch_exit.py <path of libfabpool_torch.so>"""
import json
import os
import subprocess
import sys

CHILD = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[1])
import fabpool_torch
lib = fabpool_torch.load(sys.argv[2])
p = lib.fabpool_torch_alloc(1 << 20, 0, None)
assert p, fabpool_torch.last_error()
lib.fabpool_torch_free(p, 1 << 20, 0, None)
if sys.argv[3] == "shutdown":
    fabpool_torch.shutdown()
"""


def child(lib_path, mode, how):
    env = dict(os.environ, FABPOOL_CONF="stats_print:" + mode)
    r = subprocess.run([sys.executable, "-c", CHILD, os.path.dirname(lib_path), lib_path, how], env=env,
                       capture_output=True, text=True, timeout=60)
    return r.returncode, r.stderr


def problems(lib_path):
    out = []
    rc, err = child(lib_path, "json", "exit")
    reports = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    if rc != 0 or len(reports) != 1:
        return ["json at exit: exit status %d, %d reports on stderr:\n%s" % (rc, len(reports), err)]
    r = reports[0]
    if (r["in_use_bytes"], r["in_use_bytes_peak"]) != (0, 1 << 20):
        out.append("in use %d, peak %d after a 1 MiB block; want 0 and 1 MiB" % (r["in_use_bytes"],
                                                                               r["in_use_bytes_peak"]))
    o = r.get("options", {})
    if o.get("stats_print") != "json" or o.get("thread_cache") is not False or o.get("device") != 0:
        out.append("the report's options: %r" % o)

    rc, err = child(lib_path, "text", "exit")
    if rc != 0 or err.count("fabpool: device 0") != 1 or "  options: device:0," not in err or \
            "stats_print:text" not in err:
        out.append("text at exit: exit status %d, stderr:\n%s" % (rc, err))

    rc, err = child(lib_path, "text", "shutdown")
    if rc != 0 or err.count("fabpool: device 0") != 1:
        out.append("shutdown, then exit: one report wanted; exit status %d, stderr:\n%s" % (rc, err))
    return out


def main():
    found = problems(sys.argv[1])
    for p in found:
        print("FAILED:", p)
    if found:
        print("test_torch_exit: %d FAILED" % len(found))
        return 1
    print("test_torch_exit: the report at exit, once, with the options and an exact in-use peak")
    return 0


if __name__ == "__main__":
    sys.exit(main())

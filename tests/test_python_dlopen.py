"""dlopen of libfabpool.so into a running Python with ctypes, no environment
variable needed by fabpool itself.  The pool's host metadata goes to a
private jemalloc arena when the process has jemalloc (LD_PRELOAD), and to
libc when it has none.  Usage: test_python_dlopen.py LIBFABPOOL EXPECT
where EXPECT is jemalloc or libc."""
import ctypes
import json
import sys

lib_path, expect = sys.argv[1], sys.argv[2]
lib = ctypes.CDLL(lib_path)  # would fail with "cannot allocate memory in static TLS block" if it linked jemalloc

lib.fabpool_last_error.restype = ctypes.c_char_p
lib.fabpool_status_name.restype = ctypes.c_char_p
pool = ctypes.c_void_p()
st = lib.fabpool_create(None, ctypes.byref(pool))
if st != 0:
    print("fabpool_create:", lib.fabpool_status_name(st).decode(), lib.fabpool_last_error().decode())
    sys.exit(1)

ptrs = []
for size in (256, 4096, 1 << 20, 16 << 20):
    p = ctypes.c_void_p()
    assert lib.fabpool_alloc(pool, ctypes.c_size_t(size), ctypes.byref(p)) == 0, lib.fabpool_last_error()
    assert p.value and p.value % 256 == 0
    ptrs.append(p)

buf = ctypes.create_string_buffer(1 << 16)
needed = ctypes.c_size_t()
assert lib.fabpool_stats_json(pool, buf, ctypes.c_size_t(len(buf)), ctypes.byref(needed)) == 0
stats = json.loads(buf.value.decode())
print("metadata allocator:", stats["metadata_allocator"], "blocks:", stats["blocks"], "mapped:", stats["mapped_bytes"])
ok = stats["metadata_allocator"] == expect and stats["blocks"] == 4 and stats["mapped_bytes"] >= (18 << 20)

for p in ptrs:
    assert lib.fabpool_free(pool, p) == 0
assert lib.fabpool_destroy(pool) == 0, lib.fabpool_last_error()
print("ok" if ok else "FAILED: expected metadata in %s" % expect)
print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
sys.exit(0 if ok else 1)

"""The fabpool_torch module's ctypes classes of the C structs, which it makes
at load from the layout the compiler gave them (fabpool_torch_struct_layout(),
exported by libfabpool_torch.so), against that layout: the same size, the
same fields in the same order, each at the same offset with the same size and
a ctypes type of the kind the layout names.  Then the library's check of
struct_size: a struct that says another size is refused and left as it was.
Usage: test_torch_layout.py <path of libfabpool_torch.so> <the project's version>"""
import ctypes
import json
import os
import sys

CLASSES = {   # the C struct -> the module's class made from its layout
    "fabpool_sleep_info": "SleepInfo",
    "fabpool_torch_counters": "Counters",
    "fabpool_torch_mem_stats": "_MemStats",
    "fabpool_torch_stat": "_Stat",
    "fabpool_torch_symm_info": "SymmInfo",
}


def layout_problems(ft, layout):
    """What differs between the C layout and the module's classes."""
    out = []
    if sorted(layout) != sorted(CLASSES):
        out.append("the C side lists %s, the module makes %s" % (sorted(layout), sorted(CLASSES)))
    for cname, pyname in CLASSES.items():
        c, py = layout.get(cname), getattr(ft, pyname)
        if c is None:
            continue
        if ctypes.sizeof(py) != c["size"]:
            out.append("%s: %d bytes in C, %d in the module's %s" % (cname, c["size"], ctypes.sizeof(py), pyname))
        c_fields = sorted(c["fields"].items(), key=lambda kv: kv[1][0])
        c_names, py_names = [n for n, _ in c_fields], [n for n, _ in py._fields_]
        if c_names != py_names:
            out.append("%s: fields in C %s, in the module %s" % (cname, c_names, py_names))
        py_types = dict(py._fields_)
        for name, (off, size, ftype) in c_fields:
            d = getattr(py, name, None)
            if d is not None and (d.offset, d.size) != (off, size):
                out.append("%s.%s: offset %d size %d in C, offset %d size %d in the module" %
                           (cname, name, off, size, d.offset, d.size))
            if name in py_types and kind(py_types[name]) != ftype:
                out.append("%s.%s: %s in C, %s in the module" % (cname, name, ftype, kind(py_types[name])))
    return out


def kind(t):
    """A ctypes type as the C layout names its kind."""
    if issubclass(t, ctypes.Array):
        return kind(t._type_) + "[]"
    if issubclass(t, ctypes.Structure):
        return next(c for c, py in CLASSES.items() if py == t.__name__)
    sign = "i" if t(-1).value < 0 else "u"
    return "%s%d" % (sign, 8 * ctypes.sizeof(t))


def size_check_problems(ft, lib):
    """The library's answers to the classes' struct_size: theirs accepted, another refused with nothing written."""
    out = []
    c = ft.Counters()
    if c.struct_size != ctypes.sizeof(c):
        out.append("a class does not set its own struct_size (%d, not %d)" % (c.struct_size, ctypes.sizeof(c)))
    if lib.fabpool_torch_get_counters(-1, ctypes.byref(c)) != 0:
        out.append("the counters' class is refused: %s" % ft.last_error())
    bad = ft.Counters()
    bad.struct_size = ctypes.sizeof(bad) - 8
    bad.allocs = 12345
    st = lib.fabpool_torch_get_counters(-1, ctypes.byref(bad))
    msg = ft.last_error()
    if st != 1:
        out.append("a counters struct 8 bytes short: status %d, not FABPOOL_ERR_INVALID_ARG (1)" % st)
    if bad.allocs != 12345 or bad.struct_size != ctypes.sizeof(bad) - 8:
        out.append("a refused struct was written")
    if "struct_size" not in msg or "fabpool_torch_counters" not in msg:
        out.append("the message names neither struct_size nor the struct: %r" % msg)
    m = ft._MemStats()
    m.struct_size = 0
    if lib.fabpool_torch_get_memory_stats(0, ctypes.byref(m)) != 1:
        out.append("a memory-stats struct of size 0 is not refused")
    return out


def main():
    lib_path, version = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.path.dirname(lib_path))
    import fabpool_torch as ft
    lib = ft.load(lib_path)
    lib.fabpool_torch_struct_layout.restype = ctypes.c_char_p
    lib.fabpool_torch_struct_layout.argtypes = []
    lib.fabpool_torch_version.restype = ctypes.c_char_p
    lib.fabpool_torch_version.argtypes = []
    problems = []
    have = lib.fabpool_torch_version().decode()
    if have != version:
        problems.append("the library says version %s, the project is %s" % (have, version))
    problems += layout_problems(ft, json.loads(lib.fabpool_torch_struct_layout().decode()))
    problems += size_check_problems(ft, lib)
    for p in problems:
        print("FAILED:", p)
    if problems:
        print("test_torch_layout: %d FAILED" % len(problems))
        return 1
    print("test_torch_layout: the module's classes match the C layout of %d structs (fabpool %s)" %
          (len(CLASSES), have))
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""sizecheck: lib/'s files of more than 600 lines and functions of more than 80.

Usage: tools/sizecheck.py.  Prints each one; exit status 1 if there is any."""
import glob, os, re, sys

def functions(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    i = 0
    while i < len(lines):
        l = lines[i]
        head = re.match(r"^[A-Za-z_][^;=]*\)\s*\{\s*$", l) or (
            re.match(r"^[A-Za-z_].*\)\s*$", l) and i + 1 < len(lines) and lines[i + 1] == "{")
        if head:
            j = i + 1
            while j < len(lines) and lines[j] != "}":
                j += 1
            name = re.search(r"(\w+)\s*\(", l)
            yield (name.group(1) if name else l[:40]), i + 1, j - i + 1
            i = j
        i += 1

def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    fmax, gmax = 600, 80
    bad = []
    for f in sorted(glob.glob(os.path.join(root, "lib", "*", "*.[ch]"))):
        rel = os.path.relpath(f, root)
        n = sum(1 for _ in open(f, encoding="utf-8", errors="replace"))
        if n > fmax:
            bad.append(f"{rel}: {n} lines (at most {fmax})")
        for name, line, size in functions(f):
            if size > gmax:
                bad.append(f"{rel}:{line}: {name}() is {size} lines (at most {gmax})")
    print("\n".join(bad + [f"sizecheck: {len(bad)} over the limits"]))
    return int(bool(bad))

if __name__ == "__main__":
    sys.exit(main())

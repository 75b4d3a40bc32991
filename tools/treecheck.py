#!/usr/bin/env python3
"""treecheck: the shape of the tree outside lib/'s layers, checked.

  --tree (the default) fails when
    - files of include/, perf/ or sim/ include each other in a circle
      (#include "x.h", followed through every file it names);
    - files of sim/ or perf/ call each other in a circle (a function defined
      in one file and called in another is an edge; a program's files form
      a stack, as lib/'s layers do);
    - a file cites an issue of a tracker by number (the word issue, a space
      and a number): code, tests and docs say what is, and why, not which ticket
      brought it (an upstream project's issue, "DeepEP issue #799", is a
      reference and stays);
    - a file names a stop of the project's work (the word stop, a space and
      a number) or carries a date (year-month-day, doccmds' pattern): a
      measurement is named by what was measured (the device, the driver's
      version), its history goes to docs/results/.
  --lib-limits fails when a file of lib/ (any folder below it) has more than
    600 lines, or a function of lib/ more than 80.  Lines are counted by one
    rule: a file has as many lines as an editor numbers (its newlines, and one
    more when the last line has none); a function's lines run from the line
    that holds its name to the line of its closing brace, both counted, blank
    and comment lines inside counted too (a return type on the line above the
    name is not).
  --self-test plants each violation into a copy of the tree and checks that
    it is caught (and that the tree as it is passes --tree).
Usage: tools/treecheck.py [--root DIR] [--tree | --lib-limits | --self-test | --help]
Exit status 0 when the tree keeps the rules, 1 otherwise (each violation on a line).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layercheck import C_KEYWORDS, DEF_RE, strip_c  # noqa: E402
from doccmds import DATE as DATE_RE  # noqa: E402  (the date doccmds keeps out of the docs)

INCLUDE_DIRS = ("include", "perf", "sim")
CALL_DIRS = ("sim", "perf")
CITE_DIRS = ("lib", "include", "sim", "perf", "tests", "adapters", "docs", "tools", "examples", "fuzz", "cmake",
             ".ci")
CITE_FILES = ("README.md", "CMakeLists.txt")
TEXT_EXT = (".c", ".h", ".cpp", ".hpp", ".cc", ".cu", ".py", ".sh", ".md", ".txt", ".cmake", ".in", ".map", "")
CITE_RE = re.compile(r"\b[Ii]ssues?\s+[0-9]")
STOP_RE = re.compile(r"\b[Ss]tops?\s+[0-9]+\b")
FILE_MAX, FUNC_MAX = 600, 80
# a function definition: layercheck's DEF_RE, and also a name that starts its line (its type on the line above)
FUNC_RE = re.compile(r"^(?:[A-Za-z_][\w \t\*]*?[ \t\*])?([A-Za-z_]\w*)\s*\(([^;{]|\n)*?\)\s*\{", re.M)
SOURCE_EXT = (".c", ".h", ".cpp", ".hpp", ".cc")


def read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def sources(root, top, ext=SOURCE_EXT):
    base = os.path.join(root, top)
    for dp, dns, fs in os.walk(base):
        dns[:] = sorted(d for d in dns if not d.startswith("."))
        for fn in sorted(fs):
            if fn.endswith(ext):
                yield os.path.join(dp, fn)


def circles(nodes, edges):
    """Every circle of the graph, once each (as found by a depth-first walk)."""
    found, color, stack = [], {}, []

    def visit(u):
        color[u] = 1
        stack.append(u)
        for v in sorted(edges.get(u, {})):
            if color.get(v) == 1:
                found.append(stack[stack.index(v):] + [v])
            elif not color.get(v):
                visit(v)
        stack.pop()
        color[u] = 2

    for u in sorted(nodes):
        if not color.get(u):
            visit(u)
    return found


def describe(root, what, cyc, why):
    """'what: a<why> -> b<why> -> a' for a circle [a, b, a]; why(a, b) says what leads from a to b."""
    steps = [os.path.relpath(a, root) + why(a, b) for a, b in zip(cyc, cyc[1:])]
    return f"{what}: " + " -> ".join(steps) + f" -> {os.path.relpath(cyc[0], root)}"


def include_circles(root):
    errors = []
    for top in INCLUDE_DIRS:
        files = list(sources(root, top))
        edges = {}
        for f in files:
            text = read(f)
            for m in re.finditer(r'^\s*#\s*include\s*"([^"]+)"', text, re.M):
                here = os.path.normpath(os.path.join(os.path.dirname(f), m.group(1)))
                pub = os.path.normpath(os.path.join(root, "include", m.group(1)))
                target = here if os.path.exists(here) else pub if os.path.exists(pub) else None
                if target and target != f:
                    line = text.count("\n", 0, m.start()) + 1
                    edges.setdefault(f, {})[target] = line
        errors += [describe(root, f"include circle in {top}/", cyc, lambda a, b: f":{edges[a][b]}")
                   for cyc in circles(files, edges)]
    return errors


def call_circles(root):
    """Files of one folder (and its subfolders) calling each other in a circle."""
    errors = []
    for top in CALL_DIRS:
        files = [f for f in sources(root, top, (".c", ".cpp", ".cc"))]
        src = {f: strip_c(read(f)) for f in files}
        defined = {}  # name -> files defining it (not static)
        for f, s in src.items():
            for m in DEF_RE.finditer(s):
                head = m.group(0).split("(", 1)[0]
                if m.group(1) in C_KEYWORDS or m.group(1) == "main" or re.match(r"\s*static\b", head):
                    continue
                defined.setdefault(m.group(1), set()).add(f)
        edges = {}
        ident = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
        for f, s in src.items():
            for m in ident.finditer(s):
                for g in defined.get(m.group(1), ()):
                    # a folder's files only: a subfolder (perf/train/) holds programs of its own
                    if g != f and os.path.dirname(g) == os.path.dirname(f):
                        edges.setdefault(f, {}).setdefault(g, m.group(1))
        errors += [describe(root, f"call circle in {top}/", cyc, lambda a, b: f" ({edges[a][b]}())")
                   for cyc in circles(files, edges)]
    return errors


def citations(root):
    errors = []
    paths = [os.path.join(root, f) for f in CITE_FILES if os.path.exists(os.path.join(root, f))]
    for top in CITE_DIRS:
        if os.path.isdir(os.path.join(root, top)):
            paths += [p for p in sources(root, top, TEXT_EXT) if "." in os.path.basename(p) or
                      os.path.basename(p) in ("run", "reliability")]
    for p in paths:
        if "/docs/results/" in p.replace(os.sep, "/"):
            continue  # measurement output, as the programs printed it
        try:
            text = read(p)
        except OSError:
            continue
        for rx, what in ((CITE_RE, "cites an issue by number"), (STOP_RE, "names a stop of the work"),
                         (DATE_RE, "carries a date")):
            for m in rx.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                ctx = text[m.start():text.find("\n", m.start())][:60]
                errors.append(f"{os.path.relpath(p, root)}:{line}: {what} ('{ctx}'): say what the code or test does "
                              "and why; name a measurement by what was measured")
    return errors


def file_lines(text):
    """The lines of a file as an editor numbers them (see the module's help)."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def function_lengths(text):
    """(name, first line, lines) of each function defined in C text, counted by the rule in the module's help."""
    s = strip_c(text)
    out = []
    for m in FUNC_RE.finditer(s):
        if m.group(1) in C_KEYWORDS:
            continue
        depth, i = 0, m.end() - 1
        while i < len(s):
            if s[i] == "{":
                depth += 1
            elif s[i] == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        first = s.count("\n", 0, m.start()) + 1
        out.append((m.group(1), first, s.count("\n", m.start(), i) + 1))
    return out


def lib_limits(root):
    errors = []
    for p in sources(root, "lib", (".c", ".h")):
        text = read(p)
        rel = os.path.relpath(p, root)
        n = file_lines(text)
        if n > FILE_MAX:
            errors.append(f"{rel}: {n} lines, more than {FILE_MAX}: split it where its parts hold different things")
        for name, first, lines in function_lengths(text):
            if lines > FUNC_MAX:
                errors.append(f"{rel}:{first}: {name}() has {lines} lines, more than {FUNC_MAX}: "
                              "split it into named steps")
    return errors


def check_tree(root):
    return include_circles(root) + call_circles(root) + citations(root)


def self_test(root):
    ok = True
    base = check_tree(root)
    if base:
        print("self-test: the tree itself fails the check:\n  " + "\n  ".join(base))
        return False

    def planted(what, edit, expect, run=check_tree):
        nonlocal ok
        with tempfile.TemporaryDirectory() as tmp:
            for d in ("include", "perf", "sim", "tests", "lib"):
                if os.path.isdir(os.path.join(root, d)):
                    shutil.copytree(os.path.join(root, d), os.path.join(tmp, d))
            edit(tmp)
            hit = [e for e in run(tmp) if expect in e]
            print(f"self-test: {what}: {'caught' if hit else 'NOT caught'}" + (f": {hit[0]}" if hit else ""))
            ok = ok and bool(hit)

    def write(tmp, rel, text, mode="a"):
        with open(os.path.join(tmp, rel), mode) as f:
            f.write(text)

    planted("two headers of include/ include each other",
            lambda t: (write(t, "include/planted_a.h", '#include "planted_b.h"\n', "w"),
                       write(t, "include/planted_b.h", '#include "planted_a.h"\n', "w")), "include circle in include/")
    planted("two files of sim/ include each other (through a header)",
            lambda t: (write(t, "sim/planted.h", '#include "planted.c"\n', "w"),
                       write(t, "sim/planted.c", '#include "planted.h"\n', "w")), "include circle in sim/")
    planted("two files of perf/ call each other",
            lambda t: (write(t, "perf/planted_a.c", "void planted_b(void);\nvoid planted_a(void) { planted_b(); }\n", "w"),
                       write(t, "perf/planted_b.c", "void planted_a(void);\nvoid planted_b(void) { planted_a(); }\n", "w")),
            "call circle in perf/")
    planted("a test cites an issue",
            lambda t: write(t, "tests/planted.c", f"/* the fix of issue {7} item 2 */\n", "w"), "cites an issue")
    planted("a test names a stop of the work",
            lambda t: write(t, "tests/planted.c", f"/* as stop {16} had it */\n", "w"), "names a stop of the work")
    planted("a test carries a date",
            lambda t: write(t, "tests/planted.c", f"/* measured on the H200, {2026}-12-03 */\n", "w"),
            "carries a date")
    planted("a lib file of 601 lines", lambda t: write(t, "lib/planted.c", "int planted;\n" * 601, "w"),
            "lib/planted.c: 601 lines", lib_limits)
    planted("a lib file of 601 lines, the last without a newline",
            lambda t: write(t, "lib/planted.c", "int planted;\n" * 600 + "int planted_last;", "w"),
            "lib/planted.c: 601 lines", lib_limits)
    planted("a lib function of 81 lines",
            lambda t: write(t, "lib/planted.c", "int planted(void)\n{\n" + "    planted_x();\n" * 78 + "}\n", "w"),
            "planted() has 81 lines", lib_limits)
    planted("a lib function of 81 lines, its parameters on two lines and its type above its name",
            lambda t: write(t, "lib/planted.c", "static int\nplanted(int a,\n        int b)\n{\n" +
                            "    planted_x(a, b);\n" * 77 + "}\n", "w"), "planted() has 81 lines", lib_limits)
    with tempfile.TemporaryDirectory() as tmp:  # an upstream project's issue is a reference, not a citation
        os.makedirs(os.path.join(tmp, "tests"))
        write(tmp, "tests/ref.c", "/* the leak of DeepEP issue #799 */\n", "w")
        clean = not citations(tmp)
        print(f"self-test: an upstream issue reference: {'passes' if clean else 'FLAGGED'}")
        ok = ok and clean
    return ok


def main():
    modes = {"--tree": check_tree, "--lib-limits": lib_limits}
    args = sys.argv[1:]
    if "--help" in args or "-h" in args:
        print(__doc__.strip())
        return 0
    root = args[args.index("--root") + 1] if "--root" in args else \
        os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--self-test" in args:
        passed = self_test(root)
        print(f"treecheck self-test: {'passed' if passed else 'FAILED'}")
        return int(not passed)
    run = next((fn for flag, fn in modes.items() if flag in args), check_tree)
    found = run(root)
    print("\n".join(found + [f"treecheck: {len(found)} violation(s)" if found else "treecheck: no violations"]))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())

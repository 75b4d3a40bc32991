#!/usr/bin/env python3
"""layercheck: lib/ as a stack of layers, checked.

Each folder of lib/ is a layer; lib/LAYERS gives their order, bottom first
(`order: folder folder ...`; `callback: function reason` lines name the
function pointers that lib/ keeps on purpose; `tools: stem reason` lines name
the headers that adapters/ and perf/ may include too).  A file's layer is its
folder.  It builds the graph of lib/'s includes and function references
(calls, and addresses taken) from the sources, comments and strings
stripped, and fails when
  - a lib file lies outside a layer folder, a folder is not in the order (or
    the order names a missing folder), or two files share a name (lib files
    include each other by bare name);
  - a file includes a lib header, or references a function defined in a lib
    file, of a higher layer;
  - the files of one layer reach each other in a circle;
  - a lib function's address is taken (a function pointer) and LAYERS does not
    list it as a callback;
  - a file reads or writes inside a struct of another layer that a lib struct
    holds by value: `x->f.m`, `x.f.m` or `x->f[i].m`, where f is a member
    that a struct of a lib header declares (not as a pointer) with a struct
    type defined in a header of a layer other than the file's.  A layer may
    hold another layer's struct (struct fabpool holds every layer's part) and
    hand it to that layer's functions (`&p->heap`); what is inside, it reads
    and writes only through them (a getter in that layer's header).  Names
    decide, not types: a member name that some lib struct gives to another
    layer's struct is that struct's everywhere in lib/, except a name that a
    struct of include/ also gives to a struct (fabpool_stats' classes), which
    cannot be told apart by name and is left out;
  - a file under adapters/ or perf/ includes a header of lib/ that LAYERS
    does not list as a tools header, or a CMakeLists.txt there adds lib/ to
    an include path;
  - a tools header has a .c file or includes a lib header (it must stand
    alone: the tools do not link the library's internals).
Usage: tools/layercheck.py [--root DIR] [--verbose] | --self-test
Exit status 0 when the tree keeps the rules, 1 otherwise (each violation on a line).
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

C_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof", "defined"}


def strip_c(text):
    """Blanks comments, string and character literals (keeps line count)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            # keep #include "x.h" names: they are read before stripping
            out.append(c + " " * max(0, j - i - 2) + (c if j - i >= 2 else ""))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def parse_layers(path, tools=None):
    """The layers' names bottom first, the callbacks, errors."""
    layers, callbacks, errors = [], {}, []
    with open(path) as f:
        for ln, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            if ":" not in line:
                errors.append(f"{path}:{ln}: expected 'name: stem ...' or 'callback: function reason'")
                continue
            name, rest = line.split(":", 1)
            name = name.strip()
            if name == "callback":
                parts = rest.split(None, 1)
                if len(parts) < 2:
                    errors.append(f"{path}:{ln}: a callback needs a function name and the reason it exists")
                else:
                    callbacks[parts[0]] = parts[1]
                continue
            if name == "tools":
                parts = rest.split(None, 1)
                if len(parts) < 2:
                    errors.append(f"{path}:{ln}: a tools header needs a stem and what the tools take it for")
                elif tools is not None:
                    tools[parts[0]] = parts[1]
                continue
            if name == "order":
                layers += rest.split()
                continue
            errors.append(f"{path}:{ln}: '{name}:' is not a line of LAYERS (a layer is a folder of lib/; "
                          "'order:' lists them)")
    return layers, callbacks, errors


def layout(lib, order):
    """[(layer, [stem ...])] bottom first, {file name: path under lib}, errors."""
    errors, layers, where = [], [], {}
    for e in sorted(os.listdir(lib)):
        if e == "LAYERS":
            continue
        if not os.path.isdir(os.path.join(lib, e)):
            errors.append(f"lib/{e} lies outside a layer folder: move it into the folder of its layer")
        elif e not in order:
            errors.append(f"lib/{e}/ is not in lib/LAYERS' order: add it where its layer stands")
    for name in order:
        d = os.path.join(lib, name)
        if not os.path.isdir(d):
            errors.append(f"lib/LAYERS names the layer '{name}', which has no folder lib/{name}/")
            layers.append((name, []))
            continue
        stems = []
        for f in sorted(os.listdir(d)):
            if not f.endswith((".c", ".h")):
                continue
            if f in where:
                errors.append(f"lib/{name}/{f} and lib/{where[f]} share a name: lib files include each "
                              "other by name, so each name is one file")
                continue
            where[f] = f"{name}/{f}"
            if stem(f) not in stems:
                stems.append(stem(f))
        layers.append((name, stems))
    return layers, where, errors


def lib_path(root, s, ext):
    """lib/<layer>/<s><ext> under root, or None."""
    lib = os.path.join(root, "lib")
    for d in sorted(os.listdir(lib)):
        if os.path.exists(os.path.join(lib, d, s + ext)):
            return f"lib/{d}/{s}{ext}"
    return None


def stem(f):
    return os.path.splitext(os.path.basename(f))[0]


DEF_RE = re.compile(r"^[A-Za-z_][\w \t\*]*?\b([A-Za-z_]\w*)\s*\(([^;{]|\n)*?\)\s*\{", re.M)


def enclosing_callee(s, pos):
    """The function called by the innermost parenthesis open around pos, or None."""
    depth = 0
    i = pos - 1
    while i >= 0 and pos - i < 4000:
        c = s[i]
        if c == ")":
            depth += 1
        elif c == "(":
            if depth == 0:
                m = re.search(r"([A-Za-z_]\w*)\s*$", s[max(0, i - 100):i])
                return m.group(1) if m else None
            depth -= 1
        elif c in ";{}" and depth == 0:
            return None
        i -= 1
    return None


def struct_bodies(text):
    """(names, body) of every struct defined in a header's (stripped) text: names are 'struct tag' and the
    typedef name, if any."""
    out = []
    for m in re.finditer(r"\b(typedef\s+)?struct\s+(\w+)?\s*\{", text):
        i, depth = m.end(), 1
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        names = [f"struct {m.group(2)}"] if m.group(2) else []
        tail = re.match(r"\s*(__attribute__\s*\(\(.*?\)\)\s*)?(\w+)", text[i:])
        if m.group(1) and tail:
            names.append(tail.group(2))
        out.append((names, text[m.end():i - 1]))
    return out


def struct_members(body):
    """[(type, member)] of a struct's body, by value only (no pointer, no function pointer), at its own level."""
    body = re.sub(r"^\s*#.*$", "", body, flags=re.M)
    out, depth, decl = [], 0, ""
    for c in body:
        depth += {"{": 1, "}": -1}.get(c, 0)
        if c == ";" and depth == 0:
            d = re.sub(r"\b(const|volatile|_Atomic)\b(?!\s*\()", " ", decl)
            m = re.match(r"\s*(struct\s+\w+|\w+)\s+(.*)$", d, re.S)
            if m:
                for part in m.group(2).split(","):
                    name = re.match(r"\s*([A-Za-z_]\w*)", part)
                    if name and "*" not in part and "(" not in part:
                        out.append((re.sub(r"\s+", " ", m.group(1)), name.group(1)))
            decl = ""
        elif depth == 0 and c != "}":
            decl += c
    return out


def held_structs(headers):
    """headers: {path: (layer, stripped text)}.  ({member: {(type, layer of the type)}} for every member that
    a struct of these headers holds by value with a struct type they define, {type: [its members]})."""
    types, fields = {}, {}
    for layer, text in headers.values():
        for names, body in struct_bodies(text):
            for n in names:
                types[n] = layer
                fields[n] = [m for _, m in struct_members(body)]
    held = {}
    for layer, text in headers.values():
        for names, body in struct_bodies(text):
            for t, m in struct_members(body):
                if t in types:
                    held.setdefault(m, set()).add((t, types[t]))
    return held, fields


def lib_held_structs(root, src, layer_of):
    """held_structs of lib/'s headers, less the member names that a struct of include/ also holds as a
    struct (fabpool_stats' classes): by name the two cannot be told apart."""
    held, fields = held_structs({f: (layer_of[stem(f)], s) for f, s in src.items() if f.endswith(".h")})
    inc = os.path.join(root, "include")
    pub = {}
    if os.path.isdir(inc):
        pub = {f: ("include", strip_c(open(os.path.join(inc, f), encoding="utf-8", errors="replace").read()))
               for f in sorted(os.listdir(inc)) if f.endswith(".h")}
    for name in held_structs(pub)[0]:
        held.pop(name, None)
    return held, fields


REACH_RE = re.compile(r"(->|\.)\s*([A-Za-z_]\w*)\s*(\[[^\]]*\]\s*)?\.\s*([A-Za-z_]\w*)")


def reach_inside(root, src, layer_of):
    """The places where a file reads or writes inside another layer's struct held by value (x->f.m)."""
    errors = []
    held, _ = lib_held_structs(root, src, layer_of)
    for f, s in sorted(src.items()):
        here = layer_of[stem(f)]
        for m in REACH_RE.finditer(s):
            other = sorted({f"{t} (layer {layer})" for t, layer in held.get(m.group(2), ()) if layer != here})
            if other:
                line = s.count("\n", 0, m.start()) + 1
                what = re.sub(r"\s+", "", m.group(0))
                errors.append(f"lib/{f}:{line}: {what} reads inside '{m.group(2)}', {' or '.join(other)} held by "
                              f"value; a file of layer {here} hands it to that layer's functions "
                              f"(&x{m.group(1)}{m.group(2)}) and reads it through a getter of its header")
    return errors


def check(root, verbose=False):
    lib = os.path.join(root, "lib")
    errors = []
    layers_path = os.path.join(lib, "LAYERS")
    if not os.path.exists(layers_path):
        return ["lib/LAYERS is missing: it lists lib/'s layers, bottom first"]
    tools = {}
    order, callbacks, errs = parse_layers(layers_path, tools)
    errors += errs
    if not order:
        errors.append("lib/LAYERS has no 'order:' line: it lists the layer folders, bottom first")
    layers, where, errs = layout(lib, order)
    errors += errs
    level, layer_of = {}, {}
    for i, (name, stems) in enumerate(layers):
        for s in stems:
            level[s], layer_of[s] = i, name
    files = sorted(where.values())

    raw = {f: open(os.path.join(lib, f), encoding="utf-8", errors="replace").read() for f in files}
    src = {f: strip_c(t) for f, t in raw.items()}

    # functions: name -> defining stem (non-static in .c, and every function defined in a header);
    # static functions of a .c are file-local (their address may still be taken)
    defined, static_in = {}, {}
    for f, s in src.items():
        for m in DEF_RE.finditer(s):
            head = m.group(0).split("(", 1)[0]
            name = m.group(1)
            if name in C_KEYWORDS:
                continue
            if f.endswith(".c") and re.match(r"\s*static\b", head):
                static_in.setdefault(f, set()).add(name)
            else:
                defined.setdefault(name, stem(f))

    edges = {}  # stem -> {stem: why}

    def add_edge(a, b, why):
        if a != b:
            edges.setdefault(a, {}).setdefault(b, why)

    ident = re.compile(r"\b([A-Za-z_]\w*)\b")
    for f in files:
        a = stem(f)
        for m in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', raw[f], re.M):
            inc = os.path.basename(m.group(1))
            if inc in where and stem(inc) in level:
                add_edge(a, stem(inc), f"#include \"{inc}\"")
        s = src[f]
        # a function's own definitions and declarations name it without calling
        for m in ident.finditer(s):
            name = m.group(1)
            target = defined.get(name)
            local = name in static_in.get(f, ())
            if target is None and not local:
                continue
            after = s[m.end():m.end() + 80].lstrip()
            before = s[max(0, m.start() - 80):m.start()].rstrip()
            line = s.count("\n", 0, m.start()) + 1
            if after.startswith("("):
                # a call, a definition or a declaration
                if target is not None:
                    add_edge(a, target, f"{f}:{line}: {name}()")
                continue
            # not followed by '(': its address is taken (or it is a macro argument)
            if before.endswith("#define") or re.search(r"#\s*(undef|ifdef|ifndef)\s*$", before):
                continue
            # a pointer that crosses files: a function of another file, or one handed to another
            # lib file's function (the callee of the innermost call around it)
            callee = enclosing_callee(s, m.start())
            crosses = (target is not None and target != a) or (
                callee is not None and defined.get(callee) not in (None, a))
            if crosses and name not in callbacks:
                to = f"handed to {callee}() of lib/{defined[callee]}" if callee in defined and defined[callee] != a \
                    else f"defined in lib/{target}"
                errors.append(f"lib/{f}:{line}: {name}() is used as a function pointer ({to}); a callback across "
                              f"files must be listed in lib/LAYERS as 'callback: {name} <why>'")
            if target is not None:
                add_edge(a, target, f"{f}:{line}: &{name}")

    errors += reach_inside(root, src, layer_of)

    # upward edges
    for a, outs in sorted(edges.items()):
        for b, why in sorted(outs.items()):
            if a in level and b in level and level[b] > level[a]:
                errors.append(f"upward: {a} (layer {layer_of[a]}) uses {b} (layer {layer_of[b]}, higher) at {why}")

    # circles within a layer
    for i, (name, stems) in enumerate(layers):
        inside = set(stems)
        color = {}
        stack = []

        def visit(u):
            color[u] = 1
            stack.append(u)
            for v in sorted(edges.get(u, {})):
                if v not in inside:
                    continue
                if color.get(v) == 1:
                    cyc = stack[stack.index(v):] + [v]
                    errors.append(f"circle in layer {name}: " + " -> ".join(
                        f"{x} ({edges[x][y]})" if y else x for x, y in zip(cyc, cyc[1:] + [None]) if y))
                elif not color.get(v):
                    visit(v)
            stack.pop()
            color[u] = 2

        for u in sorted(inside):
            if not color.get(u):
                visit(u)

    # the tools headers stand alone: header only, no lib header included
    for s in sorted(tools):
        if s + ".h" not in where or s + ".c" in where:
            errors.append(f"lib/LAYERS: tools header '{s}' must be a lib {s}.h alone (no {s}.c)")
            continue
        h = os.path.join(lib, where[s + ".h"])
        for m in re.finditer(r'^\s*#\s*include\s*"([^"]+)"', open(h).read(), re.M):
            if os.path.basename(m.group(1)) in where:
                errors.append(f"lib/{where[s + '.h']}: a tools header includes {os.path.basename(m.group(1))}; it must "
                              "stand alone")
    # adapters/ and perf/: the public headers only, and the tools headers
    libhdrs = {os.path.basename(f) for f in files if f.endswith(".h") and stem(f) not in tools}
    inc_dir = os.path.join(root, "include")
    pub = set(os.listdir(inc_dir)) if os.path.isdir(inc_dir) else set()
    for top in ("adapters", "perf"):
        for dp, _, fs in os.walk(os.path.join(root, top)):
            for fn in fs:
                p = os.path.join(dp, fn)
                rel = os.path.relpath(p, root)
                if fn == "CMakeLists.txt":
                    for ln, line in enumerate(open(p), 1):
                        if re.search(r"include_directories[^)]*(\$\{CMAKE_SOURCE_DIR\}|\.\.)/lib\b", line):
                            errors.append(f"{rel}:{ln}: adds lib/ to an include path; {top}/ may use include/ only")
                    continue
                if not fn.endswith((".c", ".h", ".cpp", ".cc", ".cu", ".hpp")):
                    continue
                text = open(p, encoding="utf-8", errors="replace").read()
                for m in re.finditer(r'^\s*#\s*include\s*[<"]([^">]+)[">]', text, re.M):
                    inc = m.group(1)
                    line = text.count("\n", 0, m.start()) + 1
                    base = os.path.basename(inc)
                    here = os.path.normpath(os.path.join(dp, inc))
                    in_lib = here.startswith(os.path.join(root, "lib") + os.sep)
                    if (in_lib and stem(base) not in tools) or (
                            base in libhdrs and base not in pub and not os.path.exists(here)):
                        errors.append(f"{rel}:{line}: includes lib/{base}; {top}/ may use include/ only")
    if verbose:
        for i, (name, stems) in enumerate(layers):
            print(f"layer {i} {name}: " + ", ".join(
                f"{s} -> {' '.join(sorted(edges.get(s, {})))}" if edges.get(s) else s for s in stems))
    return errors


def self_test(root):
    """Plants an upward include, a circular call, an unlisted callback, a read inside another layer's struct
    held by value and a lib include in perf/ into copies of the tree, and checks that each is caught (and the
    tree as it is passes)."""
    ok = True
    base_errors = check(root)
    if base_errors:
        print("self-test: the tree itself fails the check:\n  " + "\n  ".join(base_errors))
        return False
    order, _, _ = parse_layers(os.path.join(root, "lib", "LAYERS"))
    layers, _, _ = layout(os.path.join(root, "lib"), order)
    bottom = next(s for _, ss in layers for s in ss if lib_path(root, s, ".c"))
    top = next(s for _, ss in reversed(layers) for s in ss if lib_path(root, s, ".h"))
    multi = next(((n, ss) for n, ss in layers if sum(bool(lib_path(root, s, ".c")) for s in ss) >= 2), None)
    bottom_c, top_h = lib_path(root, bottom, ".c"), lib_path(root, top, ".h")
    top_c = next(lib_path(root, s, ".c") for _, ss in reversed(layers) for s in ss if lib_path(root, s, ".c"))

    def planted(what, edit, expect):
        nonlocal ok
        with tempfile.TemporaryDirectory() as tmp:
            for d in ("lib", "include", "adapters", "perf"):
                if os.path.isdir(os.path.join(root, d)):
                    shutil.copytree(os.path.join(root, d), os.path.join(tmp, d))
            edit(tmp)
            errs = check(tmp)
            hit = [e for e in errs if expect in e]
            print(f"self-test: {what}: {'caught' if hit else 'NOT caught'}" + (f": {hit[0]}" if hit else ""))
            ok = ok and bool(hit)

    def append(tmp, rel, text):
        with open(os.path.join(tmp, rel), "a") as f:
            f.write(text)

    planted(f"{bottom_c} includes {top}.h (upward)",
            lambda t: append(t, bottom_c, f'\n#include "{top}.h"\n'), "upward")
    planted(f"{top_c} moved into the bottom layer's folder (it now includes upward)",
            lambda t: shutil.move(os.path.join(t, top_c),
                                  os.path.join(t, os.path.dirname(bottom_c), os.path.basename(top_c))), "upward")
    planted("a file in lib/ outside a layer folder",
            lambda t: append(t, "lib/planted.c", "int fp_planted;\n"), "outside a layer folder")
    planted("a folder of lib/ that the order does not name",
            lambda t: (os.mkdir(os.path.join(t, "lib", "planted")),
                       append(t, "lib/planted/planted.c", "int fp_planted;\n")), "not in lib/LAYERS' order")
    if multi:
        a, b = [s for s in multi[1] if lib_path(root, s, ".c")][:2]
        a_c, b_c = lib_path(root, a, ".c"), lib_path(root, b, ".c")
        planted(f"{a}.c and {b}.c call each other (layer {multi[0]})",
                lambda t: (append(t, a_c, f"\nvoid fp_planted_{a}(void);\nvoid fp_planted_{b}(void);\n"
                                          f"void fp_planted_{a}(void) {{ fp_planted_{b}(); }}\n"),
                           append(t, b_c, f"\nvoid fp_planted_{a}(void);\nvoid fp_planted_{b}(void);\n"
                                          f"void fp_planted_{b}(void) {{ fp_planted_{a}(); }}\n")),
                "circle")
    planted(f"{top_c}'s function stored as a pointer by {bottom_c}",
            lambda t: (append(t, top_c, "\nint fp_planted_cb(void);\nint fp_planted_cb(void) { return 1; }\n"),
                       append(t, bottom_c, "\nint fp_planted_cb(void);\nint (*fp_planted_ptr)(void) = fp_planted_cb;\n")),
            "fp_planted_cb() is used as a function pointer")
    reach = reach_plant(root, layers)
    if not reach:
        print("self-test: no struct of the top layer holds another layer's struct: nothing to plant a read into")
        ok = False
    for form in ("x->", "(*x).") if reach else ():
        holder, member, sub = reach
        fn = f"fp_planted_reach{len(form)}"
        planted(f"{top_c} reads inside '{member}' ({form}{member}.{sub})",
                lambda t: append(t, top_c, f"\nunsigned long {fn}({holder} *x);\nunsigned long {fn}({holder} *x) "
                                           f"{{ return sizeof {form}{member}.{sub}; }}\n"),
                f"reads inside '{member}'")
    planted("perf/ includes a lib header",
            lambda t: append(t, "perf/planted.c", f'#include "{top}.h"\n'), "may use include/ only")
    planted("perf/ includes a lib header through ../lib/",
            lambda t: append(t, "perf/planted.c", f'#include "../{top_h}"\n'), "may use include/ only")
    tools = {}
    parse_layers(os.path.join(root, "lib", "LAYERS"), tools)
    for s in sorted(tools)[:1]:
        planted(f"the tools header {s}.h includes {top}.h",
                lambda t: append(t, lib_path(root, s, ".h"), f'\n#include "{top}.h"\n'), "must stand alone")
    return ok


def reach_plant(root, layers):
    """(holder, member, member of the member) for a struct of the top layer's headers that holds a struct of a
    lower layer by value, or None."""
    layer_of = {s: n for n, ss in layers for s in ss}
    src = {}
    for _, ss in layers:
        for s in ss:
            for ext in (".h", ".c"):
                p = lib_path(root, s, ext)
                if p:
                    src[p[len("lib/"):]] = strip_c(open(os.path.join(root, p)).read())
    held, fields = lib_held_structs(root, src, layer_of)
    top = layers[-1][0]
    for f, text in sorted(src.items()):
        if f.endswith(".h") and layer_of[stem(f)] == top:
            for names, body in struct_bodies(text):
                for t, m in struct_members(body):
                    if names and fields.get(t) and any(layer != top for _, layer in held.get(m, ())):
                        return names[0], m, fields[t][0]
    return None


def main():
    args = sys.argv[1:]
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if "--root" in args:
        root = args[args.index("--root") + 1]
    if "--self-test" in args:
        ok = self_test(root)
        print("layercheck self-test:", "passed" if ok else "FAILED")
        return 0 if ok else 1
    errors = check(root, "--verbose" in args)
    for e in errors:
        print(e)
    print(f"layercheck: {'no violations' if not errors else str(len(errors)) + ' violation(s)'}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

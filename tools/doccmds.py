#!/usr/bin/env python3
"""doccmds.py - runs the shell commands of fabpool's user documentation, so
that a command that is wrong in the docs fails CI.

The convention (docs/README.md says it to writers):

  ```sh              a command a reader can paste on CI's machine (Debian, the
                     CUDA headers, no GPU): this tool runs it.
  ```sh gpu          needs a GPU and its driver: listed, not run.
  ```sh torch        needs PyTorch (and a GPU): listed, not run.
  ```sh outside      writes outside the source tree (an install prefix such
                     as /opt): listed, not run.
  ```sh fragment     a pattern to adapt (./app, train.py stand for the reader's
                     program): listed, not run.
  ```sh slow         runs for minutes (a long property run, .ci/reliability):
                     listed, not run.
  ```sh ci           what CI's .ci/run runs itself, word for word (the
                     README's test command: the whole suite): each of its
                     lines must be a line of .ci/run; not run a second time.

A ```sh block that installs into an absolute prefix outside /tmp (`--prefix
/opt/...`) is listed, not run, as if tagged `outside` (the ctest test_install
runs `cmake --install` into a fresh prefix).  Any other word after `sh` is an error, and so are fences that say `bash`,
`shell` or `console`, so that every command block takes one side of the
convention.  Blocks of other languages (c, cpp, python, text) are not run.

How the commands run: in a scratch copy of the source tree (the files git
tracks, or the tree less build folders where there is no .git), one block
after another in the order of the files, each block as one `bash -e -o
pipefail` script from the copy's root, so the blocks of one file may build on
the blocks before them.  Before the first block the copy is configured and
built once with -DBUILD_TESTING=OFF (the library, the simulated driver, the
tools and examples: seconds, where the whole test suite takes minutes).  So
the README's build command finds that build and its test command runs
`ctest` over a build without tests: the test suite itself is what CI's
`.ci/run` runs with that same command, and running it a second time here
would double CI's time.  Everything else runs in full.

A block that builds a folder whole (`cmake --build build` without
`--target`, its configure not leaving the tests out) only to run one program
of it (`./build/fabpool_demo`, `build/examples/...`), with no `ctest` in the
block, is an error: a reader's first run should build what it runs (the test
suite takes minutes), with `--target`.

It also checks that every path of the source tree a document names in
backticks (`lib/base/conf.c`, `tests/install/`, `perf/*.sh`: a span that
starts with one of the tree's top folders) exists, but for the paths of an
install (`lib/cmake/fabpool/`, `lib/pkgconfig/`, `lib/fabpool/...`,
`lib/libfabpool*`, an adapter's header as `include/` has it) and another
project's files (a span after "DeepEP's", "PyTorch's", ... on its line); that
the documents hold no dates, commit hashes or issue
numbers (those belong to docs/results/, and to CHANGELOG.md, which dates
versions; another project's issue or commit named with the project is a
citation), that docs/config.md has a row for every FABPOOL_CONF key of lib/'s
conf.c, and that docs/api.md describes every function the installed headers
of include/ declare.

    doccmds.py --root SRC            run (the ctest `docs`)
    doccmds.py --root SRC --list     print every block and what would be done
    doccmds.py --root SRC --check    only the convention and the dates check (no build)
    doccmds.py --selftest            the parser and the checks against made-up documents
"""
import argparse
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

SKIP_TAGS = {
    "gpu": "needs a GPU and its driver",
    "torch": "needs PyTorch and a GPU",
    "outside": "writes outside the source tree",
    "fragment": "a pattern to adapt to the reader's program",
    "slow": "runs for minutes (CI runs such runs in .ci/reliability)",
    "ci": "CI's .ci/run runs it, word for word (checked)",
}
# the first line of a fence without a language that is a command, not a listing: it must say ```sh
COMMANDISH = re.compile(r"^\s*(cmake|ctest|bash|python3|export|for|cc|\./|\.ci/|build/|perf/|tests/|([A-Z_][A-Z0-9_]*=\S*\s))")
WRONG_LANGS = ("bash", "shell", "console", "shell-session", "zsh")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
DATE = re.compile(r"\b(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])\b")
HASH = re.compile(r"(?<![0-9A-Za-z_./-])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
# another project's issue or commit, named with the project: a citation, not this project's history
UPSTREAM = re.compile(r"\b(DeepEP|PyTorch|NCCL|RMM|vLLM)('s)? (issue #?\d+|commit [0-9a-f]{7,40})\b")
ISSUE = re.compile(r"\b(issue|Issue|PR|pull request) #?\d+\b|\(#\d+\)")
OUTSIDE_PREFIX = re.compile(r"--prefix[= ]+/(?!tmp/)")
# a backticked path of the source tree: its first word, starting with one of the tree's top folders
TREE_PATH = re.compile(r"^(lib|perf|tests|adapters|docs|sim|include|examples|tools|fuzz|cmake|\.ci)/[^\s:,;()]*$")
SPAN = re.compile(r"`([^`\n]+)`")
# what cmake --install makes under a prefix (cmake/install.cmake), named as the prefix has it
INSTALL_PATH = re.compile(r"^(lib/(cmake/fabpool|pkgconfig|fabpool)(/|$)|lib/libfabpool\b|"
                          r"include/fabpool_(hybridep\.hpp|torch\.h)$)")
# another project's file: a span after that project's name, on the same line
OTHER_PROJECT = re.compile(r"\b(DeepEP|PyTorch|NCCL|RMM|vLLM|Megatron-LM|HybridEP|jemalloc)'s\b")
BLOCK_TIMEOUT = 600


def documents(root):
    """The user documentation: README.md, docs/*.md (not docs/results/), examples/README.md."""
    out = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        out += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    ex = os.path.join(root, "examples", "README.md")
    if os.path.isfile(ex):
        out.append(ex)
    return [p for p in out if os.path.isfile(p)]


def blocks(text):
    """[(line of the fence, language, [tags], body)] of a markdown text, and a list of problems."""
    out, problems = [], []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = m.group(1), m.group(2), m.group(3).strip()
        words = info.split()
        lang = words[0].lower() if words else ""
        start = i + 1
        body = []
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(fence[0] * len(fence)) and
                                      lines[i].strip().strip(fence[0]) == ""):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        if i >= len(lines):
            problems.append((start, "a fence that is never closed"))
        i += 1
        first = next((b for b in body if b.strip()), "")
        if lang == "" and COMMANDISH.match(first):
            problems.append((start, "commands in a fence without a language: write ```sh (run in CI) or ```sh <%s>" %
                             "|".join(SKIP_TAGS)))
        elif lang in WRONG_LANGS:
            problems.append((start, "a ```%s block: write ```sh (run in CI) or ```sh <%s>" %
                             (lang, "|".join(SKIP_TAGS))))
        elif lang == "sh":
            bad = [w for w in words[1:] if w not in SKIP_TAGS]
            if bad:
                problems.append((start, "```sh %s: unknown tag %s; the tags are %s" %
                                 (" ".join(words[1:]), bad[0], ", ".join(SKIP_TAGS))))
        out.append((start, lang, words[1:], "\n".join(body)))
    return out, problems


BUILD_ALL = re.compile(r"cmake --build (\S+)(?![^&;\n]*--target)")
CONFIGURE = re.compile(r"cmake -S \S+ -B (\S+)([^&;\n]*)")


def builds_more_than_it_runs(body):
    """The build folder of the tree (build, build-real: no '/') that a block builds whole only to run one program of
    it (no ctest, tests not left out), or None."""
    if re.search(r"\bctest\b", body):
        return None
    for m in BUILD_ALL.finditer(body):
        d = m.group(1).rstrip("/")
        if "/" in d:   # a folder inside one: the reader's own project's build, which is theirs to build whole
            continue
        if any(c.group(1).rstrip("/") == d and "-DBUILD_TESTING=OFF" in c.group(2) for c in CONFIGURE.finditer(body)):
            continue
        if re.search(r"(^|[\s;&|])(\./)?%s/[\w./-]+" % re.escape(d), body[m.end():]):
            return d
    return None


def stale_marks(text):
    """[(line, what)]: dates, commit hashes and issue numbers, outside fenced blocks too."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        line = UPSTREAM.sub("", line)
        for rx, what in ((DATE, "a date"), (ISSUE, "an issue number")):
            m = rx.search(line)
            if m:
                out.append((n, "%s (%s)" % (what, m.group(0))))
        for m in HASH.finditer(line):
            word = m.group(0)
            if re.search(r"[a-f]", word) and re.search(r"\d", word):
                out.append((n, "a commit hash (%s)" % word))
    return out


def dead_paths(root, text):
    """[(line, path)]: backticked paths of the source tree that do not exist under root (a glob must match)."""
    out = []
    for n, line in enumerate(text.split("\n"), 1):
        for m in SPAN.finditer(line):
            words = m.group(1).split()
            path = words[0].rstrip(".") if words else ""
            if not TREE_PATH.match(path) or INSTALL_PATH.match(path) or OTHER_PROJECT.search(line[:m.start()]):
                continue
            if not glob.glob(os.path.join(root, path)):
                out.append((n, path))
    return out


def conf_keys(root):
    """The keys of FABPOOL_CONF: the first strings of the key table in lib/'s conf.c (wherever under lib/ it is)."""
    for d, _, names in os.walk(os.path.join(root, "lib")):
        if "conf.c" in names:
            text = open(os.path.join(d, "conf.c"), encoding="utf-8").read()
            return re.findall(r'^\s*\{"([a-z_]+)", F_[A-Z0-9]+,', text, re.M)
    return []


def public_functions(root):
    """[(header, name)]: the functions the installed headers declare (FABPOOL_API, or static inline)."""
    out = []
    for sub in ("include", "adapters/torch", "adapters/hybridep"):   # the adapters' headers install to include/ too
        inc = os.path.join(root, sub)
        for f in sorted(os.listdir(inc)) if os.path.isdir(inc) else []:
            if not (f.startswith("fabpool") and f.endswith(".h")):
                continue
            text = open(os.path.join(inc, f), encoding="utf-8").read()
            names = re.findall(r"(?:FABPOOL_API|static inline)\b[^;{(]*?\b(fabpool_\w+)\s*\(", text)
            out += [(f, n) for n in dict.fromkeys(names)]
    return out


def check(root):
    """Problems of the convention and the stale marks, as printable lines; every FABPOOL_CONF key must have its
    row in docs/config.md, and every public function of include/ its entry in docs/api.md."""
    msgs = []
    api = os.path.join(root, "docs", "api.md")
    if os.path.isfile(api):
        text = open(api, encoding="utf-8").read()
        msgs += ["docs/api.md: %s's %s is not described" % (h, n) for h, n in public_functions(root)
                 if not re.search(r"`[^`]*\b%s\b" % n, text)]
    config = os.path.join(root, "docs", "config.md")
    keys = conf_keys(root)
    if not keys:
        msgs.append("lib/: no conf.c with a key table found (tools/doccmds.py reads its keys)")
    elif os.path.isfile(config):
        text = open(config, encoding="utf-8").read()
        msgs += ["docs/config.md: the key '%s' (lib/'s conf.c) has no row of its own" % k
                 for k in keys if "\n| `%s` |" % k not in text]
    ci_path = os.path.join(root, ".ci", "run")
    ci_lines = set(l.strip() for l in open(ci_path, encoding="utf-8")) if os.path.exists(ci_path) else set()
    for path in documents(root):
        rel = os.path.relpath(path, root)
        text = open(path, encoding="utf-8").read()
        bl, problems = blocks(text)
        msgs += ["%s:%d: %s" % (rel, n, p) for n, p in problems]
        for line, lang, tags, body in bl:
            if lang == "sh" and "ci" in tags:
                msgs += ["%s:%d: a ```sh ci block's line is no line of .ci/run, which must run it as written: %s" %
                         (rel, line, l.strip()) for l in body.split("\n") if l.strip() and l.strip() not in ci_lines]
            d = builds_more_than_it_runs(body) if lang == "sh" else None
            if d:
                msgs.append("%s:%d: builds all of %s (the test suite too) to run one program of it: build what it "
                            "runs with --target" % (rel, line, d))
        msgs += ["%s:%d: %s: such marks belong to docs/results/" % (rel, n, w) for n, w in stale_marks(text)]
        msgs += ["%s:%d: `%s` is no path of the source tree: name the file where it is now" % (rel, n, p)
                 for n, p in dead_paths(root, text)]
    return msgs


def scratch_copy(root, dest):
    """The tracked files of root (or the tree less build folders and .git) under dest."""
    files = None
    if os.path.exists(os.path.join(root, ".git")):
        r = subprocess.run(["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True)
        if r.returncode == 0:
            files = [f for f in r.stdout.decode().split("\0") if f]
    if files is None:
        def ignore(d, names):
            return [n for n in names if n == ".git" or (d == root and n.startswith("build"))]
        shutil.copytree(root, dest, ignore=ignore, symlinks=True, dirs_exist_ok=True)
        return
    for f in files:
        src = os.path.join(root, f)
        if not os.path.lexists(src):
            continue   # deleted in the work tree, not yet in git's index
        os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
        shutil.copy2(src, os.path.join(dest, f), follow_symlinks=False)


def run(root, list_only):
    msgs = check(root)
    for m in msgs:
        print("FAIL", m)
    todo = []
    for path in documents(root):
        rel = os.path.relpath(path, root)
        bl, _ = blocks(open(path, encoding="utf-8").read())
        for line, lang, tags, body in bl:
            if lang != "sh":
                continue
            reasons = [SKIP_TAGS[t] for t in tags if t in SKIP_TAGS]
            if not reasons and OUTSIDE_PREFIX.search(body):
                reasons = [SKIP_TAGS["outside"] + " (an install prefix; test_install checks cmake --install)"]
            todo.append(("%s:%d" % (rel, line), body, "; ".join(reasons)))
    if list_only:
        for where, body, why in todo:
            print("%s  %s" % (where, ("skip: " + why) if why else "run"))
            print("    " + body.replace("\n", "\n    "))
        return 1 if msgs else 0
    failed = len(msgs)
    scratch = tempfile.mkdtemp(prefix="fabpool-doccmds-")
    try:
        scratch_copy(root, scratch)
        jobs = str(os.cpu_count() or 2)
        t0 = time.time()
        prep = "cmake -S . -B build -DBUILD_TESTING=OFF >/dev/null && cmake --build build -j%s >/dev/null" % jobs
        r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", prep], cwd=scratch, capture_output=True,
                           timeout=BLOCK_TIMEOUT)
        if r.returncode != 0:
            print("FAIL the scratch copy's build (%s):\n%s%s" % (prep, r.stdout.decode(), r.stderr.decode()))
            return 1
        print("built the scratch copy with -DBUILD_TESTING=OFF in %.0f s" % (time.time() - t0))
        for where, body, why in todo:
            if why:
                print("SKIP %s: %s" % (where, why))
                continue
            t0 = time.time()
            try:
                r = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", body], cwd=scratch,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=BLOCK_TIMEOUT)
                rc, out = r.returncode, r.stdout.decode(errors="replace")
            except subprocess.TimeoutExpired as e:
                rc, out = "timeout", (e.stdout or b"").decode(errors="replace")
            if rc == 0:
                print("PASS %s (%.1f s)" % (where, time.time() - t0))
            else:
                failed += 1
                tail = "\n".join(out.rstrip().split("\n")[-30:])
                print("FAIL %s: exit %s\n  %s\n--- its last output:\n%s\n---" %
                      (where, rc, body.replace("\n", "\n  "), tail))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print("%d problem(s)" % failed if failed else "every runnable command of the docs passed")
    return 1 if failed else 0


def selftest():
    bad = 0

    def expect(cond, what):
        nonlocal bad
        if not cond:
            bad += 1
            print("selftest FAIL:", what)
    doc = "\n".join(["text", "```sh", "echo a", "```", "```sh gpu", "nvidia-smi", "```", "```bash", "x", "```",
                     "```sh gpus", "y", "```", "```c", "int x;", "```", "```", "cmake -S . -B b", "```",
                     "```", "a | listing", "```", "  ```sh", "  echo indented", "  ```",
                     "```sh"])
    bl, problems = blocks(doc)
    expect([b[1] for b in bl] == ["sh", "sh", "bash", "sh", "c", "", "", "sh", "sh"],
           "languages %r" % [b[1] for b in bl])
    expect(bl[0][3] == "echo a" and bl[1][2] == ["gpu"], "bodies and tags")
    expect(bl[7][3] == "echo indented", "an indented block's body: %r" % bl[7][3])
    kinds = sorted(p for _, p in problems)
    expect(len(problems) == 4, "four problems, not %r" % kinds)
    expect(any("```bash" in p for p in kinds) and any("unknown tag gpus" in p for p in kinds) and
           any("never closed" in p for p in kinds) and any("without a language" in p for p in kinds),
           "the problems named: %r" % kinds)
    planted = "iss" "ue 22"   # apart, so that tools/treecheck.py does not take the self-test's sample for a citation
    marks = stale_marks("measured 20" "26-12-02 at a1b2c3d, see " + planted + "\n0x7f12ab34cd pointers and 12345678 and "
                        "deadbeefcafe1 and build-abc1234 are fine\nfabpool_trace and fabcafe are words")
    expect([w.split(" (")[0] for _, w in marks] == ["a date", "an issue number", "a commit hash", "a commit hash"],
           "stale marks %r" % marks)
    expect(builds_more_than_it_runs("cmake -S . -B build && cmake --build build -j && ./build/fabpool_demo") ==
           "build", "a whole build to run the demo is found")
    expect(builds_more_than_it_runs("cmake -S . -B build && cmake --build build -j --target fabpool_demo && "
                                    "./build/fabpool_demo") is None, "a build of the demo's target is fine")
    expect(builds_more_than_it_runs("cmake -S . -B b -DBUILD_TESTING=OFF && cmake --build b -j && b/fabpool_trace -h")
           is None, "a build without tests is fine")
    expect(builds_more_than_it_runs("cmake --build build -j && ctest --test-dir build") is None, "a test run is fine")
    expect(builds_more_than_it_runs("cmake --build build/myapp/out && build/myapp/out/app") is None,
           "the reader's own project is theirs")
    tree = tempfile.mkdtemp(prefix="fabpool-doccmds-selftest-")
    try:
        os.makedirs(os.path.join(tree, "lib", "base"))
        open(os.path.join(tree, "lib", "base", "conf.c"), "w").close()
        dead = dead_paths(tree, "\n".join([
            "`lib/base/conf.c` and `lib/base/` and `lib/*/conf.c` and `lib/base/conf.c:12` are there",
            "`lib/conf.c` moved; `perf/gone.sh --flag` is gone",
            "installed: `lib/pkgconfig/fabpool.pc`, `lib/fabpool/sim/libcuda.so.1`, `include/fabpool_torch.h`",
            "DeepEP's own `tests/test_hybrid_ep.py`; `build/x` and `results/y` are no tree paths"]))
        expect(dead == [(2, "lib/conf.c"), (2, "perf/gone.sh")], "dead paths %r" % dead)
    finally:
        shutil.rmtree(tree, ignore_errors=True)
    print("selftest: %s" % ("FAILED" if bad else "passed"))
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog="See the module's text for the "
                                 "fence convention.")
    ap.add_argument("--root", help="the source tree")
    ap.add_argument("--list", action="store_true", help="print each block and whether it would run")
    ap.add_argument("--check", action="store_true", help="only the fence convention and the dates check")
    ap.add_argument("--selftest", action="store_true", help="check this tool against made-up documents")
    a = ap.parse_args()
    if a.selftest:
        return selftest()
    if not a.root:
        ap.error("--root is needed")
    if a.check:
        msgs = check(a.root)
        for m in msgs:
            print("FAIL", m)
        return 1 if msgs else 0
    return run(os.path.abspath(a.root), a.list)


if __name__ == "__main__":
    sys.exit(main())

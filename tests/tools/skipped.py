#!/usr/bin/env python3
"""skipped.py - after a ctest run, each skipped test's name and the reason it printed.

CTest (3.25 here) shows a skipped test as "***Skipped" and names it under "The following tests did not run",
but never shows its output, not even with --output-on-failure (only -V does).  CTestCustom.cmake, which
tests/CMakeLists.txt writes into the build folder, runs this before and after every `ctest` of that folder:

    skipped.py before BUILD   removes the list of tests that did not run left by the run before
    skipped.py after BUILD    prints the last lines of each skipped test's output
    skipped.py --selftest     the parser against made-up files

Where ctest keeps what it needs, in BUILD/Testing/Temporary: LastTestsDisabled.log ("index:name" a line)
names the tests of the run that did not run but did not fail either (skipped, by SKIP_RETURN_CODE or
SKIP_REGULAR_EXPRESSION, or DISABLED); ctest writes it only when there is one, so the one of the run before is
removed first.  The run's log, with every test's output, is LastTest.log.tmp while the post-test commands run
(ctest renames it LastTest.log after them).  A disabled test was never started (its command is empty there)
and is left out: ctest already says "(Disabled)".

Whatever goes wrong here (a file missing, a format not understood) prints nothing and exits 0: a failing
pre- or post-test command would make the whole ctest run fail.
"""
import os
import re
import sys
import tempfile

LINES = 3  # the last lines of a skipped test's output that are shown (where tests print why they skip)
WIDTH = 200  # at most this many characters of each line


def temporary(build):
    return os.path.join(build, "Testing", "Temporary")


def read_names(path):
    """The test names of a LastTestsDisabled.log, in its order; [] if there is none."""
    names = []
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                if ":" in line:
                    names.append(line.split(":", 1)[1])
    except OSError:
        pass
    return names


TEST_LINE = re.compile(r"^\d+/\d+ Test: (.*)$")


def read_log(path):
    """{name: output lines} of each test that was started, from a LastTest.log."""
    tests = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().split("\n")
    except OSError:
        return tests
    i, n = 0, len(lines)
    while i < n:
        m = TEST_LINE.match(lines[i])
        i += 1
        if not m:
            continue
        name, started = m.group(1), True
        while i < n and lines[i] != "Output:":  # Command:, Directory:, start time
            if lines[i] == 'Command: ""':
                started = False
            i += 1
        i += 2  # "Output:" and the line of dashes under it
        out = []
        while i < n and lines[i] != "<end of output>":
            out.append(lines[i])
            i += 1
        if started:
            tests[name] = out
    return tests


def skipped(build):
    """[(name, output lines)] of the tests of the last run that were skipped."""
    tmp = temporary(build)
    names = read_names(os.path.join(tmp, "LastTestsDisabled.log"))
    if not names:
        return []
    log = os.path.join(tmp, "LastTest.log.tmp")
    if not os.path.exists(log):
        log = os.path.join(tmp, "LastTest.log")
    outputs = read_log(log)
    return [(name, outputs[name]) for name in names if name in outputs]


def report(found, build):
    if not found:
        return ""
    text = ["", "Skipped, and why (the end of each one's output; ctest --test-dir %s -R <name> -V shows all):"
            % build]
    for name, out in found:
        last = [l.rstrip()[:WIDTH] for l in out if l.strip()][-LINES:] or ["(it printed nothing)"]
        text.append("  %s: %s" % (name, last[0]))
        text.extend("  %s  %s" % (" " * len(name), l) for l in last[1:])
    return "\n".join(text) + "\n"


def main(argv):
    if len(argv) == 2 and argv[1] == "--selftest":
        return selftest()
    if len(argv) != 3 or argv[1] not in ("before", "after"):
        sys.stderr.write("usage: skipped.py before|after BUILD | --selftest\n")
        return 0
    build = argv[2]
    try:
        if argv[1] == "before":
            stale = os.path.join(temporary(build), "LastTestsDisabled.log")
            if os.path.exists(stale):
                os.remove(stale)
        else:
            sys.stdout.write(report(skipped(build), build))
            sys.stdout.flush()
    except Exception:  # never fail the ctest run over a report
        pass
    return 0


def selftest():
    """Made-up Testing/Temporary files: a passed test, one skipped by its return code, one by a regex, one that
    printed nothing, a disabled one, and the log of the run before."""
    def block(i, name, out, status, command=None):
        return ("%d/6 Testing: %s\n%d/6 Test: %s\nCommand: %s\nDirectory: /b\n\"%s\" start time: x\n"
                "Output:\n----------------------------------------------------------\n%s<end of output>\n"
                "Test time =   0.01 sec\n----------------------------------------------------------\n%s\n"
                "\"%s\" end time: x\n\"%s\" time elapsed: 00:00:00\n"
                "----------------------------------------------------------\n\n"
                % (i, name, i, name, command if command is not None else '"/bin/%s"' % name, name, out,
                   status, name, name))
    log = ("Start testing: x\n----------------------------------------------------------\n"
           + block(1, "passes", "ok\n", "Test Passed.")
           + block(2, "needs_gpu", "probing\n\nneeds_gpu: no GPU here; skipped\n", "Test Passed.")
           + block(3, "regex_skip", "SKIP: PyTorch is not importable\n",
                   "Test Pass Reason:\nSkip regular expression found in output. Regex=[SKIP: ]")
           + block(4, "fails", "went wrong\n", "Test Failed.")
           + block(5, "silent_skip", "", "Test Passed.")
           + block(6, "off", "", "Test Passed.", command='""'))
    failures = []
    with tempfile.TemporaryDirectory() as build:
        tmp = temporary(build)
        os.makedirs(tmp)
        with open(os.path.join(tmp, "LastTest.log"), "w") as f:  # the run before: not read while a .tmp is there
            f.write(block(1, "needs_gpu", "an old reason\n", "Test Passed."))
        with open(os.path.join(tmp, "LastTest.log.tmp"), "w") as f:
            f.write(log)
        with open(os.path.join(tmp, "LastTestsDisabled.log"), "w") as f:
            f.write("2:needs_gpu\n3:regex_skip\n5:silent_skip\n6:off\n")
        got = skipped(build)
        if [name for name, _ in got] != ["needs_gpu", "regex_skip", "silent_skip"]:
            failures.append("skipped: %r" % got)
        text = report(got, build)
        for want in ("  needs_gpu: probing\n", "             needs_gpu: no GPU here; skipped\n",
                     "  regex_skip: SKIP: PyTorch is not importable\n", "  silent_skip: (it printed nothing)\n"):
            if want not in text:
                failures.append("the report lacks %r:\n%s" % (want, text))
        if "an old reason" in text or "off" in text.replace("-R <name>", ""):
            failures.append("the report names the run before or a disabled test:\n%s" % text)
        # the run has ended: the log is LastTest.log again
        os.replace(os.path.join(tmp, "LastTest.log.tmp"), os.path.join(tmp, "LastTest.log"))
        if [name for name, _ in skipped(build)] != ["needs_gpu", "regex_skip", "silent_skip"]:
            failures.append("after the rename: %r" % skipped(build))
        # before: the list of the run before goes; a run that skips nothing then reports nothing
        main(["skipped.py", "before", build])
        if os.path.exists(os.path.join(tmp, "LastTestsDisabled.log")) or skipped(build) != []:
            failures.append("before: the list of the run before is kept")
        if report([], build) != "":
            failures.append("a report with nothing skipped")
        # no Testing folder at all (no test ran yet): no output, exit 0
        empty = os.path.join(build, "empty")
        if skipped(empty) != [] or main(["skipped.py", "before", empty]) != 0 or \
                main(["skipped.py", "after", empty]) != 0:
            failures.append("a build folder without Testing/")
    for f in failures:
        print("FAILED: " + f)
    print("skipped.py selftest: %s" % ("FAILED" if failures else "ok"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

#!/usr/bin/env python3
"""Fills the result sections of docs/performance.md from a fabpool_bench JSON.

    python3 perf/report.py bench.json [docs/performance.md] [--plots DIR]

Each section lies between <!-- report:NAME --> and <!-- /report:NAME --> and
is replaced as a whole, so the page can be regenerated from any run.
Python 3 standard library only."""
import json
import re
import sys


def fmt_ns(v):
    if v is None:
        return "-"
    if v >= 1e6:
        return f"{v / 1e6:.2f} ms"
    if v >= 1e3:
        return f"{v / 1e3:.1f} us"
    return f"{v:.0f} ns"


def size_name(s):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if s >= 1 << shift and s % (1 << shift) == 0:
            return f"{s >> shift} {unit}"
    return f"{s} B"


def table(head, rows):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main():
    args = [a for a in sys.argv[1:]]
    plots = None
    if "--plots" in args:
        i = args.index("--plots")
        plots = args[i + 1]
        del args[i:i + 2]
    if not args:
        sys.exit(__doc__)
    d = json.load(open(args[0]))
    page = args[1] if len(args) > 1 else "docs/performance.md"
    al = d["allocators"]
    names = {a["key"]: a["name"] for a in al}
    order = [a["key"] for a in al]
    res = d["results"]
    sec = {}

    sec["run"] = (f"Driver: `{d['driver']}` ({'simulated: times are not GPU times' if d['simulated'] else 'real GPU'})"
                  f"{', quick run' if d['quick'] else ''}.\n\n" +
                  table(["allocator", "state", "cold means"],
                        [[a["name"], "ran" if a["available"] else a["note"], a["cold_means"]] for a in al]))

    def lat(label, threads_col=False):
        cells = {}
        keys = []
        for r in res:
            if r["workload"] != "latency" or r["label"] != label:
                continue
            k = (r["size"], r["threads"])
            if k not in cells:
                cells[k] = {}
                keys.append(k)
            if r["ok"] == 1:
                ratio = r.get("ratio_to_fabpool")
                cells[k][r["allocator"]] = (f"{fmt_ns(r['median_ns'])} / {fmt_ns(r['p99_ns'])} / "
                                            f"{fmt_ns(r['p999_ns'])}" +
                                            (f" ({ratio:.1f}x)" if ratio and r["allocator"] != "fabpool" else ""))
            elif r["ok"] == 0:
                cells[k][r["allocator"]] = "failed"
        cols = [k for k in order if any(k in c for c in cells.values())]
        head = ["size"] + (["threads"] if threads_col else []) + [names[k] for k in cols]
        rows = [[size_name(s)] + ([t] if threads_col else []) + [cells[(s, t)].get(k, "-") for k in cols]
                for (s, t) in keys]
        return ("median / p99 / p99.9 of one alloc + free (ratio of the median to fabpool's)\n\n" +
                table(head, rows)) if rows else "(not run)"

    sec["latency_warm"] = lat("warm")
    sec["latency_threads"] = lat("threads", True)
    sec["latency_cold"] = lat("cold")

    def growth(w, share):
        rows = []
        for r in res:
            if r["workload"] != w or r["label"] != ("share" if share else "plain"):
                continue
            if r["ok"] != 1:
                rows.append([names[r["allocator"]], "failed: " + r.get("error", "") if r["ok"] == 0 else
                             r.get("error", "n/a")] + [""] * (9 if share else 6))
                continue
            c = r.get("calls_per_step")
            row = [names[r["allocator"]], f"{r['us_per_step']:.1f}", f"{r['step_median_us']:.1f}",
                   f"{r['step_p99_us']:.1f}", "?" if c is None else f"{c:.2f}",
                   f"{r['peak_held_over_live']:.3f}", r["base_changes"],
                   f"{r['ratio_to_fabpool']:.1f}x" if r.get("ratio_to_fabpool") else "-"]
            if share:
                db = r.get("descriptor_bytes_per_step")
                row[-1:-1] = [f"{r['exported_bytes_per_step'] / 2**20:.1f}", f"{r['imported_bytes_per_step'] / 2**20:.1f}",
                              f"{r['fds_per_step']:.2f}", "-" if db is None else f"{db:.0f}"]
            rows.append(row)
        head = ["allocator", "us/step (amortized)", "median", "p99", "driver calls/step", "peak held / peak live",
                "base changes"]
        if share:
            head += ["MiB exported/step", "MiB imported/step", "fds/step", "descriptor B/step"]
        head += ["vs fabpool"]
        return table(head, rows) if rows else "(not run)"

    sec["growth"] = growth("growth", False)
    sec["growth_share"] = growth("growth", True)
    sec["trace"] = growth("trace", False)
    sec["trace_share"] = growth("trace", True)

    rows = []
    for r in res:
        if r["workload"] == "mixed":
            if r["ok"] == 1:
                rows.append([r["label"], names[r["allocator"]], fmt_ns(r["median_ns"]), fmt_ns(r["p99_ns"]),
                             fmt_ns(r["p999_ns"]), f"{r['peak_held_over_live']:.3f}",
                             f"{r['ratio_to_fabpool']:.1f}x" if r.get("ratio_to_fabpool") else "-",
                             f"{r['ops_done']}/{r['n_ops']}"])
            elif r["ok"] == 0:
                rows.append([r["label"], names[r["allocator"]], "failed: " + r.get("error", "")] + [""] * 5)
    sec["mixed"] = table(["case", "allocator", "median ns/op", "p99", "p99.9", "peak held / peak live",
                          "vs fabpool", "ops done"], rows) if rows else "(not run)"

    sec["goals"] = table(["goal", "value", "limit", "met"],
                         [[g["goal"], "-" if g["value"] is None else f"{g['value']:.3f}",
                           ("<= " if g["at_most"] else ">= ") + f"{g['limit']:g} {g['unit']}",
                           "n/a" if g["met"] is None else ("yes" if g["met"] else "**no**")]
                          for g in d.get("goals", [])])
    if plots:
        sec["plots"] = "\n\n".join(f"![{n}]({plots}/{n}.png)" for n in
                                   ("latency-warm", "latency-cdf", "latency-cold", "growth-memory", "trace-memory"))

    text = open(page).read()
    for name, body in sec.items():
        pat = re.compile(r"(<!-- report:%s -->\n).*?(<!-- /report:%s -->)" % (name, name), re.S)
        text, n = pat.subn(lambda m: m.group(1) + body + "\n" + m.group(2), text)
        if not n:
            print(f"report.py: no section '{name}' in {page}", file=sys.stderr)
    open(page, "w").write(text)
    print(f"report.py: {page} filled from {args[0]}")


if __name__ == "__main__":
    main()

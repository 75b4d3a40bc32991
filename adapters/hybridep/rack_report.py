#!/usr/bin/env python3
"""rack_report.py RUN.json... [--svg OUT.svg] [--baseline-gib 242] - the
tables and the plot of docs/performance.md ("The seed's run at rack scale")
from hybridep_rack's JSON lines, one file per rank count.

  - per way, at the largest rank count: device memory per GPU at the first and
    the last step and the regrows; per rank and regrow (the median over the
    regrows after the first allocation): creates, exports, imports, handle
    bytes sent and gathered, and the modelled time;
  - the extrapolation: each of those per-rank figures fitted over all the runs
    (least squares; BASIS_* say which functions of the ranks R), evaluated at
    72 ranks and at each run's rank count, beside what a partial run (fewer
    ways, e.g. 72 ranks stopped after the first way) gave;
  - the plot (SVG, written here: no plotting library needed): device memory per
    GPU over the steps, the four ways, at the largest rank count, plus
    --baseline-gib less the first step's buffer set (the rest of the rank's
    memory: the seed's rank held about 242 GiB before its climb), so that the
    lines read as the rank's device memory."""
import argparse
import json
import statistics
import sys

WAYS = ["leaky", "fixed", "unchanged", "inplace"]
LABEL = {
    "leaky": "upstream's fabric allocator as it is",
    "fixed": "upstream with the releases added",
    "unchanged": "fabpool, DeepEP unchanged",
    "inplace": "fabpool in place",
}
STYLE = {  # colour, dash pattern, width: the three that hold the live set lie on one line
    "leaky": ("#c0392b", "", 2.5),
    "fixed": ("#2c3e50", "", 5),
    "unchanged": ("#27ae60", "10,6", 3),
    "inplace": ("#2980b9", "2,5", 3),
}
GiB = float(1 << 30)
FIGS = [("cuMemCreate_per_rank", "creates"), ("cuMemExportToShareableHandle_per_rank", "exports"),
        ("cuMemImportFromShareableHandle_per_rank", "imports"), ("sent_per_rank", "handle bytes sent"),
        ("gathered_per_rank", "handle bytes gathered"), ("model_us_mean", "modelled time (us)")]


def load(path):
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by = {w: [r for r in rows if r["way"] == w] for w in WAYS}
    return rows[0]["ranks"], by


def per_regrow(rows, key):
    """the median of key over the regrows after the first allocation"""
    v = [r[key] for r in rows if r["regrow"] and r["step"] > 0]
    return statistics.median(v) if v else 0.0


def fit(basis, xs, ys):
    """least squares over the basis functions (normal equations, Gauss-Jordan); returns the fitted function"""
    n = len(basis)
    m = [[sum(basis[i](x) * basis[j](x) for x in xs) for j in range(n)] +
         [sum(basis[i](x) * y for x, y in zip(xs, ys))] for i in range(n)]
    for i in range(n):
        p = max(range(i, n), key=lambda r: abs(m[r][i]))
        m[i], m[p] = m[p], m[i]
        for r in range(n):
            if r != i and m[i][i]:
                f = m[r][i] / m[i][i]
                m[r] = [a - f * b for a, b in zip(m[r], m[i])]
    c = [m[i][n] / m[i][i] if m[i][i] else 0.0 for i in range(n)]
    return lambda x: sum(ci * b(x) for ci, b in zip(c, basis))


# What each figure is, per rank, as a function of the ranks R: counts and handle bytes are per-buffer constants,
# one per peer, and rank 0's two completion flags shared out (a + b R + c / R); memory per GPU is the buffer set
# (the token buffer grows with R, the prob and all-gather ones with R^2); the time prices calls (~R) and the
# bytes they map and unmap: every view of every peer's set (~R^2 and R^3).
BASIS_COUNT = [lambda r: 1.0, lambda r: float(r), lambda r: 1.0 / r]
BASIS_MEMORY = [lambda r: 1.0, lambda r: float(r), lambda r: float(r * r)]
BASIS_TIME = [lambda r: 1.0, lambda r: float(r), lambda r: float(r * r), lambda r: float(r ** 3)]


def svg(path, ranks, by, base):
    """the ways the run has; where it lacks some, the live set beside them (what the other ways hold)"""
    ways = [w for w in WAYS if by[w]]
    lines = [(w, LABEL[w], STYLE[w], [(r["step"], r["held_per_gpu"]) for r in by[w]]) for w in ways]
    if len(ways) < len(WAYS):
        ref = by[ways[0]]
        lines.append(("live", "the live set", ("#7f8c8d", "4,4", 3),
                      [(r["step"], r["live_per_gpu"]) for r in ref]))
    W, H, L, R, T, B = 900, 480, 80, 330, 40, 60
    steps = max(len(pts) for *_, pts in lines)
    ys = [base + v / GiB for *_, pts in lines for _, v in pts]
    lo, hi = min(ys), max(ys)
    span = max(hi - lo, 1e-9)
    lo, hi = lo - 0.05 * span, hi + 0.05 * span
    X = lambda i: L + (W - L - R) * i / max(steps - 1, 1)
    Y = lambda v: T + (H - T - B) * (1 - (v - lo) / (hi - lo))
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="13">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="24" font-size="15">Device memory per GPU over the steps, {ranks} ranks '
         f'(HybridEP buffer set, hidden 7,168; simulated driver)</text>',
         f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
         f'<text x="{(L + W - R) / 2}" y="{H - 20}" text-anchor="middle">step (variable-length batches; '
         f'every new high regrows)</text>',
         f'<text x="18" y="{(T + H - B) / 2}" transform="rotate(-90 18 {(T + H - B) / 2})" '
         f'text-anchor="middle">GiB per GPU</text>']
    for k in range(6):
        v = lo + (hi - lo) * k / 5
        o.append(f'<line x1="{L - 5}" y1="{Y(v):.1f}" x2="{W - R}" y2="{Y(v):.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{L - 8}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:.1f}</text>')
    for i in range(0, steps, max(1, steps // 8)):
        o.append(f'<text x="{X(i):.1f}" y="{H - B + 18}" text-anchor="middle">{i}</text>')
    for n, (w, label, (c, dash, wd), pts) in enumerate(lines):
        xy = " ".join(f"{X(i):.1f},{Y(base + v / GiB):.1f}" for i, v in pts)
        d = f' stroke-dasharray="{dash}"' if dash else ""
        o.append(f'<polyline fill="none" stroke="{c}" stroke-width="{wd}"{d} points="{xy}"/>')
        ly = T + 20 + 22 * n
        o.append(f'<line x1="{W - R + 15}" y1="{ly}" x2="{W - R + 50}" y2="{ly}" stroke="{c}" stroke-width="{wd}"{d}/>')
        o.append(f'<text x="{W - R + 58}" y="{ly + 4}">{label}</text>')
    if len(ways) == len(WAYS):
        o.append(f'<text x="{W - R + 15}" y="{T + 20 + 22 * 4 + 10}" font-size="11">(the last three hold the live '
                 f'set: one line)</text>')
    o.append(f'<text x="{W - R + 15}" y="{T + 20 + 22 * 5 + 6}" font-size="11">baseline: the rank\'s other '
             f'memory, {base:.1f} GiB</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--svg")
    ap.add_argument("--baseline-gib", type=float, default=242.0)
    ap.add_argument("--partial", help="a run with fewer ways (stopped early): checked against the fit, plotted "
                    "with the live set (--partial-svg)")
    ap.add_argument("--partial-svg")
    a = ap.parse_args()
    runs = sorted((load(p) for p in a.runs), key=lambda x: x[0])
    part = load(a.partial) if a.partial else None
    ranks, by = runs[-1]
    first_set = by["leaky"][0]["held_per_gpu"] / GiB
    base = a.baseline_gib - first_set
    regrows = sum(r["regrow"] for r in by["leaky"])
    print(f"Largest run: {ranks} ranks, {len(by['leaky'])} steps, {regrows} regrows "
          f"(token highs {', '.join(str(r['high']) for r in by['leaky'] if r['regrow'])}).\n")
    print("| per GPU, per rank | " + " | ".join(LABEL[w] for w in WAYS) + " |")
    print("| --- |" + " --- |" * len(WAYS))
    row = lambda name, f: print(f"| {name} | " + " | ".join(f(w) for w in WAYS) + " |")
    row("device memory, first step (GiB)", lambda w: f"{by[w][0]['held_per_gpu'] / GiB:.2f}")
    row("device memory, last step (GiB)", lambda w: f"{by[w][-1]['held_per_gpu'] / GiB:.2f}")
    row(f"with the rest of the rank ({base:.1f} GiB): first -> last",
        lambda w: f"{base + by[w][0]['held_per_gpu'] / GiB:.0f} -> {base + by[w][-1]['held_per_gpu'] / GiB:.0f}")
    row("live set, last step (GiB)", lambda w: f"{by[w][-1]['live_per_gpu'] / GiB:.2f}")
    for key, name in FIGS:
        fmt = (lambda v: f"{v:,.0f}") if "us" in key or "bytes" in name else (lambda v: f"{v:.1f}")
        row(f"{name} per regrow", lambda w, k=key, f=fmt: f(per_regrow(by[w], k)))
    if len(runs) >= 3:
        xs = [n for n, _ in runs]
        pn = part[0] if part else None
        print(f"\nExtrapolation (least squares over the runs at {', '.join(map(str, xs))} ranks; per rank and "
              f"regrow, the median over the regrows after the first):\n")
        head = "| figure | way | " + " | ".join(f"{n} ranks: run / fit" for n in xs) + " | 72 ranks: fit |"
        if part:
            head += f" {pn} ranks: run |"
        print(head)
        print("| --- | --- |" + " --- |" * (len(xs) + 1 + (1 if part else 0)))
        for key, name in FIGS + [("held_last", "device memory per GPU, last step (GiB)")]:
            basis = BASIS_MEMORY if key == "held_last" else BASIS_TIME if "us" in key else BASIS_COUNT
            for w in WAYS:
                get = (lambda b, ww=w: b[ww][-1]["held_per_gpu"] / GiB) if key == "held_last" else \
                    (lambda b, ww=w, k=key: per_regrow(b[ww], k))
                f = fit(basis, xs, [get(b) for _, b in runs])
                cells = " | ".join(f"{get(b):,.1f} / {f(n):,.1f}" for n, b in runs)
                tail = ""
                if part:
                    tail = f" {get(part[1]):,.1f} |" if part[1][w] else " - |"
                print(f"| {name} | {w} | {cells} | {f(72):,.1f} |" + tail)
    if a.svg:
        svg(a.svg, ranks, by, base)
        print(f"\n(plot: {a.svg})")
    if part and a.partial_svg:
        pb = part[1]
        ways = [w for w in WAYS if pb[w]]
        pbase = a.baseline_gib - pb[ways[0]][0]["held_per_gpu"] / GiB
        svg(a.partial_svg, part[0], pb, pbase)
        last = pb[ways[0]][-1]
        print(f"\n{part[0]} ranks ({', '.join(ways)} only): device memory per GPU {pbase + pb[ways[0]][0]['held_per_gpu'] / GiB:.0f} -> "
              f"{pbase + last['held_per_gpu'] / GiB:.0f} GiB with the rest of the rank ({pbase:.1f} GiB), live set "
              f"{pbase + last['live_per_gpu'] / GiB:.0f} GiB (plot: {a.partial_svg})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

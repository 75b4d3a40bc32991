#!/usr/bin/env python3
"""rounds.py OUT ROUNDS LABEL... - the regrowth runs of deepep-run.sh made in rounds in turns
(regrow-<LABEL>.r<k>.json, k = 1..ROUNDS): per label the median regrow over every round's regrows, each
round's median, and the ratio to the first label's (upstream's) median.  Prints lines starting "ROUNDS"."""
import json
import os
import statistics
import sys


def main():
    out, rounds, labels = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    med = {}
    for label in labels:
        times, per_round = [], []
        for k in range(1, rounds + 1):
            path = os.path.join(out, f"regrow-{label}.r{k}.json")
            try:
                with open(path) as f:
                    r = json.load(f)
            except (OSError, ValueError):
                per_round.append(None)
                continue
            first = min(row["tokens"] for row in r["rows"]) if r["rows"] else 0
            t = [row["us"] for row in r["rows"] if row["tokens"] > first]
            times += t
            per_round.append(round(statistics.median(t), 1) if t else None)
        if not times:
            print(f"ROUNDS {label}: no regrows")
            continue
        med[label] = statistics.median(times)
        ratio = f", {med[label] / med[labels[0]]:.2f}x {labels[0]}'s" if labels[0] in med and label != labels[0] else ""
        print(f"ROUNDS {label}: {len(times)} regrows in {rounds} rounds in turns, median {med[label]:.1f} us{ratio}; "
              f"each round's median {per_round}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

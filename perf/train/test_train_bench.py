"""test_train_bench.py - the training benchmark's own arithmetic, without PyTorch or a GPU.

train_bench.py's parent process turns the runs' JSON reports into the figures that go into
docs/performance.md: per allocator the median of the runs' median step times and their spread, the peak held
by the driver, the steady-state driver allocations a step, the step-by-step ratio, the bitwise comparison of
the losses, and one printed block per run.  This test feeds it reports whose answers are known (made here, as a
run would write them) and checks every figure, so that a mistake in that code shows here and not in a table
measured on the H200.

    python3 perf/train/test_train_bench.py      (exit 0: passed)
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_bench as tb  # noqa: E402  (imports no torch at module level)

MIB = 1 << 20
failed = []


def check(cond, what):
    if not cond:
        failed.append(what)
        print("FAIL:", what)


def report(allocator, run, times, held=None, losses=None, allocs=(100, 105), profile=None, sampler_cost=None):
    """A run's report as run_one writes it: step i took times[i] seconds."""
    steps = len(times)
    losses = losses or [1.0 + 0.25 * i for i in range(steps)]
    driver = {"samples": 0 if held is None else 5000, "error": None, "nvml_note": ""}
    if held is not None:
        driver["held_peak"] = held
    if sampler_cost:
        driver.update(sample_cost_us_mean=sampler_cost[0], sample_cost_us_max=sampler_cost[1], sampler="c")
    launches = [t / 2 for t in times]
    return {"allocator": allocator, "run": run, "steps": steps, "seqs": [64 + 100 * i for i in range(steps)],
            "step_times": list(times), "median_step_s": tb.statistics.median(times[10:] or times),
            "launch_times": launches, "median_launch_s": tb.statistics.median(launches[10:] or launches),
            "torch_empty_del_ns": {"4096": 1500.0, "1048576": 1600.0},
            "driver": driver, "requested_peak": 1000 * MIB, "allocated_peak": 1010 * MIB,
            "reserved_peak": 1100 * MIB, "device_allocs": allocs[1], "device_frees": 0,
            "device_allocs_steady": allocs[1] - allocs[0], "loss_sum": sum(losses),
            "losses_hex": [v.hex() for v in losses], "profile": profile}


def steps(base, slow_from=10, extra=0.0):
    """14 step times: 10 warm-up steps of 1 s, then base + i ms (+ extra from step slow_from on)."""
    return [1.0] * 10 + [base + i * 1e-3 + (extra if 10 + i >= slow_from else 0.0) for i in range(4)]


def main():
    args = argparse.Namespace(allocators=["default", "expandable", "fabpool"])
    runs = [
        report("default", 0, steps(0.060), held=1300 * MIB),
        report("default", 1, steps(0.062), held=1300 * MIB, losses=[1.0 + 0.25 * i + 1e-9 for i in range(14)]),
        report("expandable", 0, steps(0.050), held=1030 * MIB),
        report("expandable", 1, steps(0.054), held=1034 * MIB),
        report("expandable", 2, steps(0.052), held=None),               # a run without the sampler
        report("fabpool", 0, steps(0.051), held=1060 * MIB, allocs=(600, 607)),
        report("fabpool", 1, steps(0.049), held=1064 * MIB, allocs=(600, 608)),
        report("fabpool", 2, steps(0.070), held=1062 * MIB, allocs=(600, 609)),
    ]
    s = tb.summarize(args, runs)

    # step times: each run's median over steps 10..13 (base + 1.5 ms), then the median over runs
    ex = s["expandable"]
    check([round(m, 6) for m in ex["median_step_ms_per_run"]] == [51.5, 55.5, 53.5], "expandable per-run medians")
    check(abs(ex["median_of_medians_ms"] - 53.5) < 1e-9, "expandable median of medians")
    check(abs(ex["spread_ms"] - 4.0) < 1e-9, "expandable spread")
    check(abs(s["fabpool"]["median_of_medians_ms"] - 52.5) < 1e-9, "fabpool median of medians (an outlier run)")
    check(abs(ex["median_launch_ms_per_run"][0] - 25.75) < 1e-9, "launch medians")

    # peak held: the runs that measured it, their median; a run without the sampler does not count as 0
    check(ex["held_peak_mib_per_run"] == [1030, 1034] and ex["held_peak_mib"] == 1032, "expandable held peak")
    check(s["fabpool"]["held_peak_mib"] == 1062, "fabpool held peak")
    check(s["default"]["live_peak_mib"] == 1000, "live peak")

    # driver allocations a step in the steady state: (allocs - allocs at step 10) / (steps - 10), median
    check(abs(s["fabpool"]["device_allocs_per_step_steady"] - 2.0) < 1e-9, "steady allocs a step")

    # losses: bitwise against the default's first run
    check(s["default"]["losses_equal_default_run0"] == [True, False], "losses bitwise, default")
    check(s["fabpool"]["losses_equal_default_run0"] == [True, True, True], "losses bitwise, fabpool")

    # step by step: each step's median over the runs, summed over steps 10..13
    p = tb.paired_steps(runs, args.allocators)
    want = {"default": 61 * 4 + 6, "expandable": 52 * 4 + 6, "fabpool": 51 * 4 + 6}
    for a, v in want.items():
        check(p is not None and abs(p[a] - v) < 1e-6, "paired steps of %s: %s, want %s" % (a, p and p.get(a), v))
    check(tb.paired_steps([report("default", 0, [0.1] * 10)], ["default"]) is None, "paired steps need step 10")

    # the table: one row per allocator, n/a where nothing was measured
    t = tb.table(s)
    rows = [line for line in t.splitlines() if line.startswith("| ") and not line.startswith("| allocator")
            and not line.startswith("| ---")]
    check(len(rows) == 3 and rows[1].startswith("| expandable | 53.5 ms (51.5, 55.5, 53.5) | 4.0 ms | 1032 MiB"),
          "table row: %r" % (rows[1] if len(rows) > 1 else None))
    s_none = tb.summarize(args, [report("default", 0, steps(0.06))])
    check("n/a" in tb.table(s_none), "table says n/a without a held peak")

    # what is printed for a run: every block, with or without the sampler and the profile
    prof = {"step_ms": 59.8, "gpu_busy_ms": 59.7, "top_gpu": [["mm", 74, 12.0]] * 5,
            "top_cpu": [["mm", 74, 6.8]] * 5, "cuda_api": []}
    lines = tb.run_lines(report("fabpool", 3, steps(0.05), held=1062 * MIB, profile=prof,
                                sampler_cost=(17.6, 3000.0)), 12.3)
    check(lines[0].startswith("fabpool run 3: median 51.5 ms/step (25.8 ms to queue it), held peak 1062 MiB"),
          "run line: %r" % lines[0])
    check(any("sampler: 5000 samples, cuMemGetInfo 17.6 us mean" in x for x in lines), "sampler line")
    check(any("profiled step: 59.8 ms, GPU busy 59.7 ms" in x for x in lines), "profile line")
    check(any("torch.empty + del: 4096 B 1500 ns" in x for x in lines), "allocation path line")
    bare = tb.run_lines(report("default", 0, steps(0.05)), 1.0)
    check(len(bare) == 2 and "held peak n/a MiB" in bare[0], "a run without sampler or profile: %r" % bare)

    print("test_train_bench: %d failed" % len(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Sums the kernels of an ncu CSV (bench/run-kernel-profile.sh: `ncu --csv
--print-units base --metrics gpu__time_duration.sum,gpc__cycles_elapsed.max`
over one step, or over some launches) by kernel name, in the format of
torch_step.py --profile: ms, launches, the mean cycles of a launch (where
the CSV has them), kernel; the largest first, then the total and the sums
by kind (GEMMs, attention, the rest).

Usage: bench/kernel_summary.py NCU.csv [TOP]
"""
import csv
import sys
from collections import defaultdict

KINDS = [
    ("GEMM", ("gemm", "nvjet", "xmma", "cutlass", "cublas")),
    ("attention", ("hopper", "flash", "cudnn", "fmha", "attention")),
]


def kind(name):
    low = name.lower()
    for label, words in KINDS:
        if any(w in low for w in words):
            return label
    return "other"


def main():
    path = sys.argv[1]
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    ns = defaultdict(float)
    cycles = defaultdict(float)
    launches = defaultdict(int)
    with open(path, newline="") as f:
        # ncu prints its own lines (==PROF==) before the table.
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        metric = row.get("Metric Name")
        if metric not in ("gpu__time_duration.sum", "gpc__cycles_elapsed.max"):
            continue
        name = row["Kernel Name"]
        try:
            value = float(row["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        if metric == "gpc__cycles_elapsed.max":
            cycles[name] += value
            continue
        ns[name] += value
        launches[name] += 1
    rows = sorted(((t / 1e6, launches[n], n) for n, t in ns.items()),
                  reverse=True)
    total = sum(r[0] for r in rows)
    print(f"{total:.2f} ms of kernels, {sum(launches.values())} launches "
          "(ms, launches, mean cycles a launch, kernel):")
    for ms, count, name in rows[:top]:
        mean = f"{cycles[name] / count:10.0f}" if name in cycles else " " * 10
        print(f"{ms:9.3f} {count:5d} {mean}  {name[:150]}")
    by_kind = defaultdict(float)
    for ms, _, name in rows:
        by_kind[kind(name)] += ms
    print("by kind: " + ", ".join(f"{k} {v:.2f} ms"
                                  for k, v in sorted(by_kind.items())))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks the planner's predictions against steps measured on the GPU
(issue 28): for each configuration of bench/planner-configs.txt, the
predicted step of `megatron-compile --report step` against the measured one
(bench/planner-measured-h200.txt, from bench/run-planner-check.sh), their
relative error and the Spearman rank correlation; then, per model, whether
`--auto-parallel --num-gpus 1 --gpu-memory 40GB` picks the fastest measured
configuration that fits (or one within 3% of it).

Usage: bench/planner_check.py COMPILER [--measured FILE]
Exit status 1 when an error, the correlation or a pick is over its limit,
or when a model's pick is no configuration of planner-configs.txt
(configurations without a measurement are listed and left out; a pick
among them is reported as not measured yet).
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLAGS = ["--bf16", "--fuse-kernels", "--fuse-linear-cross-entropy"]


def configs():
    with open(os.path.join(ROOT, "bench", "planner-configs.txt")) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 5 and not line.startswith("#"):
                yield fields


def ranks(values):
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2.0
        i = j + 1
    return out


def spearman(a, b):
    ra, rb = ranks(a), ranks(b)
    n = len(a)
    ma, mb = sum(ra) / n, sum(rb) / n
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb)


def compile_args(model, global_batch, mb, recompute):
    return [os.path.join(ROOT, "models", model + ".yaml"), *FLAGS,
            "--global-batch-size", global_batch, "--micro-batch-size", mb,
            "--recompute-granularity", recompute]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compiler")
    parser.add_argument("--measured", default=os.path.join(
        ROOT, "bench", "planner-measured-h200.txt"))
    args = parser.parse_args()
    measured = {}
    with open(args.measured) as f:
        for line in f:
            fields = line.split()
            if len(fields) == 2 and re.match(r"^[0-9.]+$", fields[1]):
                measured[fields[0]] = float(fields[1])
    rows, failed = [], False
    for name, model, global_batch, mb, recompute in configs():
        if name not in measured:
            print(f"{name}: not measured")
            continue
        text = subprocess.run(
            [args.compiler, *compile_args(model, global_batch, mb, recompute),
             "--report", "step"], check=True, capture_output=True,
            text=True).stdout
        step = float(re.search(r"step ([0-9.]+) ms", text).group(1))
        memory = re.search(r"memory ([0-9.]+ \w+)", text).group(1)
        rows.append((name, model, step, measured[name], memory))
    print(f"{'configuration':30} {'predicted':>10} {'measured':>10} "
          f"{'error':>7}  memory")
    worst = 0.0
    for name, model, predicted, actual, memory in rows:
        error = (predicted - actual) / actual
        worst = max(worst, abs(error))
        print(f"{name:30} {predicted:10.1f} {actual:10.1f} {error:+7.1%}  "
              f"{memory}")
    rho = spearman([r[2] for r in rows], [r[3] for r in rows])
    total = sum(1 for _ in configs())
    print(f"{len(rows)} of {total} configurations measured; largest error "
          f"{worst:.1%} (limit 10%); Spearman {rho:.3f} (limit 0.9)")
    failed |= worst > 0.10 or rho < 0.9
    # The pick under 40 GB against the fastest measured that fits.
    for model in sorted({r[1] for r in rows}):
        global_batch = next(c[2] for c in configs() if c[1] == model)
        text = subprocess.run(
            [args.compiler, os.path.join(ROOT, "models", model + ".yaml"),
             *FLAGS, "--global-batch-size", global_batch, "--auto-parallel",
             "--num-gpus", "1", "--gpu-memory", "40GB", "--plan-top", "1"],
            check=True, capture_output=True, text=True).stdout
        flags = re.search(r"1: (.*)", text).group(1)
        mb = re.search(r"--micro-batch-size (\d+)", flags).group(1)
        recompute = re.search(r"--recompute-granularity (\w+)", flags).group(1)
        pick = f"{model}-g{global_batch}-mb{mb}-{recompute}"
        fits = []
        for name, m, predicted, actual, memory in rows:
            value, unit = memory.split()
            gib = float(value) * (1 / 1024 if unit == "MiB" else 1)
            if m == model and gib * 2**30 <= 40e9:
                fits.append((actual, name))
        best = min(fits)
        if pick not in measured:
            # A configuration of planner-configs.txt that no H200 run has
            # measured yet is reported as such; any other pick fails.
            queued = any(c[0] == pick for c in configs())
            print(f"{model}: the pick {pick} was not measured"
                  + (" yet (in planner-configs.txt: bench/run-planner-check.sh"
                     " measures it)" if queued else ""))
            failed |= not queued
            continue
        ratio = measured[pick] / best[0]
        print(f"{model}: pick {pick} {measured[pick]:.1f} ms; fastest "
              f"measured within 40 GB {best[1]} {best[0]:.1f} ms "
              f"({ratio - 1:+.1%}, limit +3%)")
        failed |= ratio > 1.03
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks the planner's cost model against published training throughputs at
scale (issue 28): for each line of bench/planner-published.txt, the MFU that
`megatron-compile --report step` predicts for the published layout on the
published cluster, against the published MFU. The error is the predicted
step's over the published step (MFU is inversely proportional to the step).

With --picks, also runs the planner (--auto-parallel) on each line's model
and cluster and prints its pick's predicted step beside the published
layout's (issue 28: the pick is predicted at least as fast); this takes
minutes (the 405B search is about a minute on 2 cores).

Usage: bench/planner_published.py COMPILER [--picks]
Exit status 1 when an error is over 15%, or with --picks when a pick is
predicted slower than the published layout.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLUSTERS = {
    "a100": ["--gpu-memory", "80GB", "--peak-tflops", "312",
             "--gpu-memory-bandwidth", "2039", "--intra-node-bandwidth",
             "230", "--inter-node-bandwidth", "22"],
    # 80 GB of HBM3 is 81,559 MiB, as nvidia-smi reports it.
    "h100": ["--gpu-memory", "81559MiB", "--gpu-memory-bandwidth", "3350"],
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compiler")
    parser.add_argument("--picks", action="store_true",
                        help="run the planner on each line's model and "
                             "cluster too")
    args = parser.parse_args()
    failed = False
    picks = []
    print(f"{'layout':16} {'GPUs':>6} {'published MFU':>14} "
          f"{'predicted MFU':>14} {'step error':>11}  predicted step")
    with open(os.path.join(ROOT, "bench", "planner-published.txt")) as f:
        for line in f:
            fields = line.split()
            if not fields or line.startswith("#"):
                continue
            name, model, gpus, cluster, published = fields[:5]
            text = subprocess.run(
                [args.compiler, os.path.join(ROOT, "models", model + ".yaml"),
                 "--report", "step", "--num-gpus", gpus, *CLUSTERS[cluster],
                 *fields[5:]], check=True, capture_output=True,
                text=True).stdout
            step = float(re.search(r"step ([0-9.]+) ms", text).group(1))
            mfu = float(re.search(r"MFU ([0-9.]+)%", text).group(1))
            error = float(published) / mfu - 1
            failed |= abs(error) > 0.15
            print(f"{name:16} {gpus:>6} {float(published):13.2f}% "
                  f"{mfu:13.1f}% {error:+11.1%}  {step / 1000:.2f} s")
            picks.append((name, model, gpus, cluster, step))
    print("every error within 15%" if not failed
          else "an error over 15%")
    if args.picks:
        print(f"\n{'layout':16} {'published ms':>13} {'pick ms':>10} "
              f"{'pick/published':>15}  pick")
        for name, model, gpus, cluster, step in picks:
            text = subprocess.run(
                [args.compiler, os.path.join(ROOT, "models", model + ".yaml"),
                 "--auto-parallel", "--num-gpus", gpus, *CLUSTERS[cluster],
                 "--plan-top", "1"], check=True, capture_output=True,
                text=True).stdout
            row = re.search(r"^  1 +([0-9.]+) .*?% +\S+ \S+ +\S+ +\S+ +\S+ +"
                            r"(tp .*)$", text, re.M)
            pick = float(row.group(1))
            failed |= pick > step
            print(f"{name:16} {step:13.1f} {pick:10.1f} "
                  f"{pick / step:15.3f}  {row.group(2)}")
        print("every pick at least as fast" if not failed
              else "a pick slower than the published layout, or an error "
                   "over 15%")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

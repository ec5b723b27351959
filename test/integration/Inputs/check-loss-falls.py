#!/usr/bin/env python3
"""Checks that training lowered the loss (train-tiny-gpt.test).

Usage: check-loss-falls.py LOG.jsonl FRACTION [RESUMED.jsonl]

LOG.jsonl is megatron-train's --log-jsonl file: one object per iteration
with "iteration" and "loss", and one per evaluation with "eval_loss".
Prints the first and the last iteration's loss and exits 1 unless the last
is below FRACTION times the first. With RESUMED.jsonl, the log of a run
started from the first run's saved weights, its first iteration's loss must
be below FRACTION times the first run's first loss too.
"""
import json
import sys


def losses(path):
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    iterations = [r for r in records if "loss" in r]
    if not iterations:
        sys.exit("%s: no iteration records" % path)
    return iterations


def check(what, first, later, fraction):
    ratio = later / first
    ok = ratio < fraction
    print("%s: loss %.4f -> %.4f, %.1f%% of the first, %s %g%%"
          % (what, first, later, 100 * ratio, "below" if ok else "NOT below",
             100 * fraction))
    return ok


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    fraction = float(sys.argv[2])
    run = losses(sys.argv[1])
    ok = check("iterations %d..%d" % (run[0]["iteration"], run[-1]["iteration"]),
               run[0]["loss"], run[-1]["loss"], fraction)
    if len(sys.argv) == 4:
        resumed = losses(sys.argv[3])
        ok &= check("resumed from the saved weights, iteration %d"
                    % resumed[0]["iteration"], run[0]["loss"],
                    resumed[0]["loss"], fraction)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks a bf16 run against the float32 run of the same bundle's model
(train-bf16-host.test), or an FP8 run against the bf16 one
(train-fp8-host.test).

Usage: compare-precision.py FP32.jsonl BF16.jsonl TOLERANCE [WIDE NARROW]

WIDE and NARROW name the two precisions in the messages (default float32
and bf16).

Both files are megatron-train --log-jsonl logs of the same iterations. Every
"loss" of the bf16 run must be within TOLERANCE (relative) of the float32
run's and at least one must differ from it: a bf16 run that equals the
float32 one rounded nothing. Prints the largest relative difference; exits 1
otherwise.
"""
import json
import sys


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f
                if line.strip() and "loss" in json.loads(line)]


def main():
    fp32, bf16, tolerance = sys.argv[1], sys.argv[2], float(sys.argv[3])
    wide, narrow = (sys.argv[4:6] if len(sys.argv) >= 6
                    else ("float32", "bf16"))
    a, b = losses(fp32), losses(bf16)
    if len(a) != len(b) or not a:
        sys.exit("%d and %d losses; expected the same nonzero count" %
                 (len(a), len(b)))
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    print("%d losses: %s within %.1e of %s (largest relative "
          "difference %s)" % (len(a), narrow, tolerance, wide,
                              "below" if worst <= tolerance else "above"))
    if worst > tolerance:
        sys.exit("largest relative difference %g" % worst)
    if a == b:
        sys.exit("the %s losses equal the %s ones: nothing was rounded" %
                 (narrow, wide))


if __name__ == "__main__":
    main()

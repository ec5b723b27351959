#!/usr/bin/env python3
"""Compares mtrt-run's eval_step loss with transformers' (hf-reference-loss.test).

Usage: compare-hf-loss.py REFERENCE EVAL_OUTPUT TOLERANCE

REFERENCE is make-hf-reference.py's reference.txt (`loss-f64 V`, the loss
transformers computed in float64); EVAL_OUTPUT is what `mtrt-run --function
eval_step` prints: `output 0: [] f32` (or f64), then the value. Prints both
and their relative difference; exits 1 when it is above TOLERANCE.
"""
import re
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    reference = None
    with open(sys.argv[1]) as f:
        for line in f:
            words = line.split()
            if words and words[0] == "loss-f64":
                reference = float(words[1])
    if reference is None:
        sys.exit("%s: no 'loss-f64' line" % sys.argv[1])
    with open(sys.argv[2]) as f:
        lines = f.read().split("\n")
    if not re.match(r"output 0: \[\] f(32|64)$", lines[0]):
        sys.exit("%s: expected 'output 0: [] f32', found %r" % (sys.argv[2], lines[0]))
    value = float(lines[1])
    tolerance = float(sys.argv[3])
    difference = abs(value - reference) / abs(reference)
    verdict = "<=" if difference <= tolerance else ">"
    print("loss: transformers %.9f, mtrt-run %.9f, relative difference %.2e %s %g"
          % (reference, value, difference, verdict, tolerance))
    sys.exit(0 if difference <= tolerance else 1)


if __name__ == "__main__":
    main()

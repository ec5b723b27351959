#!/usr/bin/env python3
"""Compares mtrt-run's outputs with gpt2_reference.py's (reference-loss.test).

Usage: compare-reference.py REFERENCE EVAL_OUTPUT PREDICT_OUTPUT [TOLERANCE]

REFERENCE holds gpt2_reference.py's lines `loss V` and `logits B S V...`;
EVAL_OUTPUT and PREDICT_OUTPUT are what `mtrt-run --function eval_step` and
`--function predict_step` print: `output 0: SHAPE DTYPE`, then one value per
line in row-major order. Prints one line per comparison and exits 1 when a
relative difference is above TOLERANCE (default 1e-9): |a - b| / |b| for the
loss, max |a - b| / max |b| over the position's logits.
"""
import re
import sys


def read_output(path):
    with open(path) as f:
        lines = f.read().split("\n")
    m = re.match(r"output 0: \[([0-9, ]*)\] f64$", lines[0])
    if not m:
        sys.exit("%s: expected 'output 0: [...] f64', found %r" % (path, lines[0]))
    shape = [int(d) for d in m.group(1).split(",") if d.strip()]
    n = 1
    for d in shape:
        n *= d
    return shape, [float(x) for x in lines[1:1 + n]]


def main():
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    tolerance = float(sys.argv[4]) if len(sys.argv) == 5 else 1e-9
    reference = {}
    with open(sys.argv[1]) as f:
        for line in f:
            words = line.split()
            reference[words[0]] = words[1:]
    failed = False

    want = float(reference["loss"][0])
    _, (got,) = read_output(sys.argv[2])
    diff = abs(got - want) / abs(want)
    ok = diff <= tolerance
    failed |= not ok
    print("loss: reference %.17g, mtrt-run %.17g, relative difference %.3g %s %g"
          % (want, got, diff, "<=" if ok else "ABOVE", tolerance))

    b, s = int(reference["logits"][0]), int(reference["logits"][1])
    want = [float(x) for x in reference["logits"][2:]]
    shape, values = read_output(sys.argv[3])
    vocab = shape[2]
    start = (b * shape[1] + s) * vocab
    got = values[start:start + vocab]
    diff = max(abs(x - y) for x, y in zip(got, want)) / max(abs(y) for y in want)
    ok = len(got) == len(want) and diff <= tolerance
    failed |= not ok
    print("logits[%d, %d, :] (%d values): max relative difference %.3g %s %g"
          % (b, s, len(want), diff, "<=" if ok else "ABOVE", tolerance))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

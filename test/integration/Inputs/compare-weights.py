#!/usr/bin/env python3
"""Checks that the weights a run on several ranks saved match the one-rank
run's (multi-rank-distributed-optimizer.test).

Usage: compare-weights.py ONE.safetensors RANKS.safetensors [--bitwise]

Both files are megatron-train --save-weights outputs (F32). Every tensor
must be present in both with the same shape, and the parameters, as one
vector, must agree within 1e-5 relative in the L2 norm:
||one - ranks|| <= 1e-5 ||one||. Elementwise relative error is no measure
here: AdamW divides by the root of the second moment, so an element whose
gradients are near zero turns the rounding of reordered sums into a visible
change of its update (the worst tensor is printed too). With --bitwise,
every element must have the same bits. Prints what it compared and the largest
difference; exits 1 on a mismatch.
"""
import sys

from safetensors_file import read_float32

TOLERANCE = 1e-5


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    bitwise = "--bitwise" in sys.argv
    one, ranks = read_float32(args[0]), read_float32(args[1])
    if sorted(one) != sorted(ranks):
        sys.exit("the files hold different tensors: %s vs %s"
                 % (sorted(one), sorted(ranks)))
    squares, errors, elements, worst = 0.0, 0.0, 0, (0.0, "")
    for name in sorted(one):
        shape, raw, x = one[name]
        other_shape, other_raw, y = ranks[name]
        if shape != other_shape:
            sys.exit("%s: shape %s vs %s" % (name, shape, other_shape))
        if bitwise and raw != other_raw:
            at = next(i for i in range(len(x))
                      if raw[4 * i:4 * i + 4] != other_raw[4 * i:4 * i + 4])
            sys.exit("%s: element %d differs in its bits: %.9g vs %.9g"
                     % (name, at, x[at], y[at]))
        norm = sum(a * a for a in x)
        error = sum((a - b) ** 2 for a, b in zip(x, y))
        squares += norm
        errors += error
        worst = max(worst, ((error / max(norm, 1e-60)) ** 0.5, name))
        elements += len(x)
    difference = (errors / max(squares, 1e-60)) ** 0.5
    if difference > TOLERANCE:
        sys.exit("||one - ranks|| / ||one|| = %.3g > %g (worst tensor: %s, "
                 "%.3g)" % (difference, TOLERANCE, worst[1], worst[0]))
    print("%d tensors, %d elements: %s" % (
        len(one), elements,
        "bit for bit" if bitwise else "equal within %g relative" % TOLERANCE))
    print("||one - ranks|| / ||one|| = %.3g; worst tensor %s: %.3g"
          % (difference, worst[1], worst[0]), file=sys.stderr)


if __name__ == "__main__":
    main()

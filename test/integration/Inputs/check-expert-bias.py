#!/usr/bin/env python3
"""Checks the expert biases a run saved (moe-expert-bias.test).

Usage: check-expert-bias.py WEIGHTS.safetensors RATE ITERATIONS [OTHER]

Every tensor named *.e_score_correction_bias must hold, after ITERATIONS
updates of +-RATE or 0 each (Megatron-LM's get_updated_expert_bias), only
multiples k RATE with |k| <= ITERATIONS (to float32 rounding), and not
only zeros; with OTHER (another run's file), each bias must equal OTHER's
exactly. Prints what it checked; exits 1 otherwise.
"""
import sys

from safetensors_file import read_float32


def main():
    path, rate, iterations = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    tensors = read_float32(path)
    other = read_float32(sys.argv[4]) if len(sys.argv) > 4 else None
    biases = sorted(n for n in tensors if n.endswith(".e_score_correction_bias"))
    if not biases:
        sys.exit("%s: no expert bias" % path)
    moved, steps = 0, set()
    for name in biases:
        values = tensors[name][2]
        for v in values:
            k = round(v / rate)
            if abs(k) > iterations or abs(v - k * rate) > 1e-6 * iterations:
                sys.exit("%s: %s holds %r, not a multiple of %g within %d "
                         "updates" % (path, name, v, rate, iterations))
            moved += k != 0
            steps.add(k)
        if other is not None and other[name][2] != values:
            sys.exit("%s: %s differs from %s's: %s vs %s"
                     % (path, name, sys.argv[4], values, other[name][2]))
    if not moved:
        sys.exit("%s: every expert bias is still zero" % path)
    print("%d expert biases, %d entries moved, steps %s%s"
          % (len(biases), moved, sorted(steps),
             "; equal to the other run's" if other is not None else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

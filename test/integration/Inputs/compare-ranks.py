#!/usr/bin/env python3
"""Checks that a run on several ranks matches the one-rank run
(multi-rank-equivalence.test).

Usage: compare-ranks.py ONE.jsonl RANKS.jsonl [--grad-norm] [--moe-losses]
                        [--bitwise|--exact] [--tolerance=T]

Both files are megatron-train --log-jsonl logs. Every iteration's "loss" (and
every evaluation's "eval_loss") must agree within 1e-5 relative (or T:
bf16 runs, whose roundings follow other sums); with --grad-norm, every
"grad_norm" too; with --moe-losses, the reported MoE losses ("lm_loss",
"aux_loss", "load_balancing_loss" or "seq_load_balancing_loss", "z_loss")
that both logs hold. With --bitwise they must be equal: the
losses as float32 (the step computes them in float32; a log that averages
several micro-batches does so in double, and the float32 rounding of that
exact mean of two floats is the float32 sum a data-parallel all-reduce
makes), the gradient norms exactly. With --exact every value must be equal
as logged (the doubles, full precision): for runs that average the same
micro-batches in the same way. Prints what it compared and the largest
relative difference; exits 1 on a mismatch.
"""
import json
import struct
import sys

DEFAULT_TOLERANCE = 1e-5


def float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    keys = ["loss", "eval_loss"]
    if "--grad-norm" in sys.argv:
        keys.append("grad_norm")
    one, ranks = records(args[0]), records(args[1])
    if "--moe-losses" in sys.argv:
        # The balancing loss under the name its type logs it by.
        balancing = ("seq_load_balancing_loss"
                     if any("seq_load_balancing_loss" in r for r in one)
                     else "load_balancing_loss")
        keys += ["lm_loss", "aux_loss", balancing, "z_loss"]
    exact = "--exact" in sys.argv
    bitwise = exact or "--bitwise" in sys.argv
    tolerance = DEFAULT_TOLERANCE
    for a in sys.argv[1:]:
        if a.startswith("--tolerance="):
            tolerance = float(a.split("=", 1)[1])
    if len(one) != len(ranks):
        sys.exit("%s has %d records but %s has %d"
                 % (args[0], len(one), args[1], len(ranks)))
    worst, compared = 0.0, 0
    for a, b in zip(one, ranks):
        for key in keys:
            if key not in a and key not in b:
                continue
            if key not in a or key not in b:
                sys.exit("record %s: %s in only one log" % (a, key))
            x, y = float(a[key]), float(b[key])
            if bitwise and not exact and key != "grad_norm":
                x, y = float32(x), float32(y)
            difference = abs(x - y) / max(abs(x), 1e-30)
            if bitwise and x != y:
                sys.exit("iteration %s: %s %.9g (one rank) vs %.9g (ranks) "
                         "differ in their bits"
                         % (a.get("iteration"), key, x, y))
            worst = max(worst, difference)
            compared += 1
            if difference > tolerance:
                sys.exit("iteration %s: %s %.9g (one rank) vs %.9g (ranks), "
                         "relative difference %.3g > %g"
                         % (a.get("iteration"), key, x, y, difference,
                            tolerance))
    iterations = sum(1 for r in one if "loss" in r)
    print("%d iterations, %d values (%s): %s"
          % (iterations, compared, ", ".join(keys),
             "equal as logged" if exact else
             "bit for bit" if bitwise else
             "equal within %g relative (largest %.2g)" % (tolerance, worst)))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks the reported MoE losses of a megatron-train --log-jsonl log
(moe-reported-losses.test).

Usage: check-reported-losses.py LOG.jsonl
                                [AUX_COEFF Z_COEFF MOE_LAYERS [WITHOUT.jsonl]]

Every iteration: lm_loss + aux_loss is the loss (1e-6 relative); with the
coefficients, aux_loss is MOE_LAYERS * (AUX_COEFF * load_balancing_loss (or
seq_load_balancing_loss) + Z_COEFF * z_loss) (1e-5 relative): the two
reported losses are the kinds'
sums over the MoE layers without their coefficients, divided by the MoE
layers. With
WITHOUT.jsonl (the same model and data without auxiliary losses), the first
iteration's lm_loss is its first loss (1e-6 relative): the same weights see
the same batch. Prints what held; exits 1 otherwise.
"""
import json
import sys


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def close(x, y, tolerance, what):
    difference = abs(x - y) / max(abs(y), 1e-30)
    if difference > tolerance:
        sys.exit("%s: %.9g vs %.9g, relative difference %.3g > %g"
                 % (what, x, y, difference, tolerance))
    return difference


def main():
    log = [r for r in records(sys.argv[1]) if "loss" in r]
    worst = 0.0
    for r in log:
        it = "iteration %d" % r["iteration"]
        worst = max(worst, close(r["lm_loss"] + r["aux_loss"], r["loss"],
                                 1e-6, it + ": lm_loss + aux_loss"))
    if len(sys.argv) < 5:
        print("%d iterations: lm_loss + aux_loss = loss (largest %.2g)"
              % (len(log), worst))
        return
    aux_coeff, z_coeff = float(sys.argv[2]), float(sys.argv[3])
    layers = int(sys.argv[4])
    # The balancing loss under the name its type logs it by.
    balancing = ("seq_load_balancing_loss"
                 if any("seq_load_balancing_loss" in r for r in log)
                 else "load_balancing_loss")
    for r in log:
        expected = layers * (aux_coeff * r.get(balancing, 0) +
                             z_coeff * r.get("z_loss", 0))
        worst = max(worst, close(r["aux_loss"], expected, 1e-5,
                                 "iteration %d: aux_loss" % r["iteration"]))
    print("%d iterations: lm_loss + aux_loss = loss, aux_loss = %d x "
          "(%g %s + %g z_loss) (largest %.2g)"
          % (len(log), layers, aux_coeff, balancing, z_coeff, worst))
    if len(sys.argv) > 5:
        without = [r for r in records(sys.argv[5]) if "loss" in r]
        d = close(log[0]["lm_loss"], without[0]["loss"], 1e-6,
                  "the first lm_loss against the loss without auxiliary losses")
        print("the first lm_loss is the loss without auxiliary losses "
              "(relative %.2g)" % d)


if __name__ == "__main__":
    main()

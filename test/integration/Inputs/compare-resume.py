#!/usr/bin/env python3
"""Compares a resumed run with the uninterrupted one (checkpoint-*.test).

Usage: compare-resume.py FULL.jsonl RESUMED.jsonl --from N [--tolerance T]
                         [--iterations K]

Both files are megatron-train --log-jsonl logs. Every iteration >= N of
RESUMED (the first K of them with --iterations) must be in FULL with the same
loss, grad_norm and learning rate (and, for --fp16 runs, loss_scale and
whether the step was skipped; a skipped step's grad_norm is null in both):
bit for bit without --tolerance, else within T relative. Evaluations at those iterations are compared the same way.
Prints what it compared; exits 1 on a mismatch.
"""
import argparse
import json
import sys


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("full")
    parser.add_argument("resumed")
    parser.add_argument("--from", dest="first", type=int, required=True)
    parser.add_argument("--tolerance", type=float, default=None)
    parser.add_argument("--iterations", type=int, default=None)
    args = parser.parse_args()

    def keyed(path):
        out = {}
        for r in records(path):
            kind = "eval" if "eval_loss" in r else "train"
            out[(kind, r["iteration"])] = r
        return out

    full, resumed = keyed(args.full), keyed(args.resumed)
    iterations = sorted(i for (kind, i) in resumed
                        if kind == "train" and i >= args.first)
    if args.iterations is not None:
        iterations = iterations[:args.iterations]
    if not iterations or iterations[0] != args.first:
        sys.exit("%s: no iteration %d" % (args.resumed, args.first))
    if min(i for (_, i) in resumed) < args.first:
        sys.exit("%s starts before iteration %d" % (args.resumed, args.first))
    worst, compared = 0.0, 0
    for i in iterations:
        for kind, keys in (("train", ("loss", "grad_norm", "lr", "loss_scale",
                                      "skipped")),
                           ("eval", ("eval_loss",))):
            if (kind, i) not in resumed:
                continue
            if (kind, i) not in full:
                sys.exit("%s has no %s record for iteration %d"
                         % (args.full, kind, i))
            a, b = full[(kind, i)], resumed[(kind, i)]
            for key in keys:
                if key not in a and key not in b:
                    continue
                if a.get(key) is None or b.get(key) is None:
                    if a.get(key) is not None or b.get(key) is not None:
                        sys.exit("iteration %d: %s %s (uninterrupted) vs %s "
                                 "(resumed)" % (i, key, a.get(key), b.get(key)))
                    compared += 1
                    continue
                x, y = float(a[key]), float(b[key])
                difference = abs(x - y) / max(abs(x), 1e-30)
                worst = max(worst, difference)
                compared += 1
                exact = args.tolerance is None
                if (exact and x != y) or (not exact and
                                          difference > args.tolerance):
                    sys.exit("iteration %d: %s %.17g (uninterrupted) vs %.17g "
                             "(resumed), relative difference %.3g"
                             % (i, key, x, y, difference))
    how = ("bit-identical" if args.tolerance is None else
           "equal within %g relative" % args.tolerance)
    print("iterations %d..%d, %d values: %s" %
          (iterations[0], iterations[-1], compared, how))


if __name__ == "__main__":
    main()

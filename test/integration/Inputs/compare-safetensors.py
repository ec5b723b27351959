#!/usr/bin/env python3
"""Compares the tensors of two safetensors files (checkpoint-reshard.test).

Usage: compare-safetensors.py A B [--tolerance T] [--as-float32]

The files must hold the same tensor names, dtypes and shapes; their values
must be equal bit for bit, or with --tolerance within T of the largest
magnitude of each tensor. __metadata__ is not compared. With --as-float32,
A may hold F64 tensors, compared as their rounding to float32, and tensors
that B lacks (a Hugging Face file's buffers and tied lm_head.weight), which
are named. Prints what it compared; exits 1 on a mismatch.
"""
import argparse
import sys

from safetensors_file import read_float32


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--tolerance", type=float, default=None)
    parser.add_argument("--as-float32", action="store_true")
    args = parser.parse_args()
    a, b = read_float32(args.a, args.as_float32), read_float32(args.b)
    extra = sorted(set(a) - set(b)) if args.as_float32 else []
    for name in extra:
        del a[name]
    if sorted(a) != sorted(b):
        sys.exit("different tensors: %s vs %s" % (sorted(a), sorted(b)))
    worst = 0.0
    for name in sorted(a):
        (sa, ra, va), (sb, rb, vb) = a[name], b[name]
        if sa != sb:
            sys.exit("%s: shape %s vs %s" % (name, sa, sb))
        if args.tolerance is None:
            if ra != rb:
                sys.exit("%s: the values differ" % name)
            continue
        scale = max([abs(x) for x in va] + [1e-30])
        for x, y in zip(va, vb):
            worst = max(worst, abs(x - y) / scale)
        if worst > args.tolerance:
            sys.exit("%s: difference %.3g > %g" % (name, worst, args.tolerance))
    how = ("bit-identical" if args.tolerance is None else
           "equal within %g of each tensor's largest value" % args.tolerance)
    print("%d tensors: %s%s" % (len(a), how,
                                "; not in B: " + ", ".join(extra)
                                if extra else ""))


if __name__ == "__main__":
    main()

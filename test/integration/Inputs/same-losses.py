"""Checks that training logs (megatron-train --log-jsonl) agree bit for bit.

Usage: same-losses.py REFERENCE.jsonl OTHER.jsonl...
Compares each iteration's loss and gradient norm (and the evaluation loss),
as the exact numbers the log holds (JSON keeps every digit of a double), and
fails naming the file, the iteration and both values at the first
difference.
"""
import json
import sys


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    reference = read(sys.argv[1])
    if not reference:
        sys.exit(f"{sys.argv[1]}: no iterations logged")
    for path in sys.argv[2:]:
        other = read(path)
        if len(other) != len(reference):
            sys.exit(f"{path}: {len(other)} iterations, the reference has "
                     f"{len(reference)}")
        for ref, got in zip(reference, other):
            # Training records hold the loss and norm, evaluation records
            # the evaluation loss.
            for key in ("loss", "grad_norm", "eval_loss"):
                if ref.get(key) != got.get(key):
                    sys.exit(f"{path}: iteration {ref['iteration']}: {key} "
                             f"{got.get(key)!r}, the reference has "
                             f"{ref.get(key)!r}")
    print(f"{len(sys.argv) - 2} runs equal the reference bit for bit: "
          f"{len(reference)} iterations of losses and gradient norms")


main()

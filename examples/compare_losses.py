#!/usr/bin/env python3
"""Compares the per-iteration losses of two JSON-lines logs (megatron-train's
--log-jsonl and an example's): prints the largest relative difference and
fails above --tolerance.

  compare_losses.py megatron-train.jsonl example.jsonl --tolerance 1e-5
"""
import argparse
import json
import sys


def losses(path):
    with open(path) as f:
        return {r["iteration"]: r["loss"] for r in map(json.loads, f)
                if "iteration" in r and "loss" in r}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("reference")
    parser.add_argument("candidate")
    parser.add_argument("--tolerance", type=float, default=1e-5)
    args = parser.parse_args()
    reference, candidate = losses(args.reference), losses(args.candidate)
    common = sorted(set(reference) & set(candidate))
    if not common or len(common) != len(reference):
        print(f"compare_losses: iterations differ: {sorted(reference)} vs "
              f"{sorted(candidate)}")
        return 1
    worst = max(abs(candidate[i] - reference[i]) / abs(reference[i])
                for i in common)
    for i in common:
        print(f"iteration {i}: {reference[i]:.6f} {candidate[i]:.6f}")
    verdict = "within" if worst <= args.tolerance else "ABOVE"
    print(f"compare_losses: {len(common)} iterations, largest relative "
          f"difference {worst:.3e}, {verdict} {args.tolerance:g}")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Turns the GPU's kernel times into the planner's calibration (issue 28).

Reads the `calibration:` lines megatron-train prints with
MTRT_CUDA_PROFILE_INSTRUCTIONS=1 (bench/run-planner-check.sh collects them
into calibration.txt) and writes data/calibration-h200.json: per distinct op
and operand and result types, the mean microseconds of one instruction,
weighted by how many instructions each run's line counted.

Usage: bench/make-calibration.py CALIBRATION_TXT OUT_JSON [--device NAME]
"""
import argparse
import json
import re

LINE = re.compile(r"^calibration: (\S+) (.*?) -> (.*?) ([0-9.]+) us x(\d+)$")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("calibration")
    parser.add_argument("out")
    parser.add_argument("--device", default="NVIDIA H200")
    args = parser.parse_args()
    sums = {}
    order = []
    with open(args.calibration) as f:
        for line in f:
            match = LINE.match(line.strip())
            if not match:
                continue
            op, operands, results, us, count = match.groups()
            key = (op, operands, results)
            if key not in sums:
                sums[key] = [0.0, 0]
                order.append(key)
            sums[key][0] += float(us) * int(count)
            sums[key][1] += int(count)
    if not order:
        raise SystemExit(f"{args.calibration}: no calibration: lines")
    ops = [{"op": op, "operands": operands, "results": results,
            "us": round(sums[(op, operands, results)][0] /
                        sums[(op, operands, results)][1], 3),
            "count": sums[(op, operands, results)][1]}
           for op, operands, results in order]
    with open(args.out, "w") as f:
        json.dump({"description": "Kernel times measured on the GPU by "
                                  "bench/run-planner-check.sh "
                                  "(megatron-train, "
                                  "MTRT_CUDA_PROFILE_INSTRUCTIONS=1); "
                                  "docs/Planner.md",
                   "device": args.device, "ops": ops}, f, indent=1)
        f.write("\n")
    print(f"{args.out}: {len(ops)} kernels")


if __name__ == "__main__":
    main()

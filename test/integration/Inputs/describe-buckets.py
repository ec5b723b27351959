"""Describes the gradient buckets of a bundle's plan (megatron-compile
--emit plan) and checks where they start (overlap-grad-reduce-plan.test):
each bucket's slice, its parameters, its ready_after, whether that is the
last accumulate_gradient of its parameters, and whether every
accumulate_gradient follows the instruction that writes its gradient.

Usage: describe-buckets.py PLAN.json
"""
import json
import sys

plan = json.load(open(sys.argv[1]))
functions = {f["name"]: f for f in plan["functions"]}
buffers = plan.get("gradient_buffers") or [plan["gradient_buffer"]]
# Where each parameter's gradient is accumulated: (function, instruction).
accumulated = {}
early = True
for function in plan["functions"]:
    written = set()
    for index, inst in enumerate(function["instructions"]):
        if inst["op"] == "accumulate_gradient":
            accumulated.setdefault(inst["attrs"]["parameter"], []).append(
                (function["name"], index))
            # The gradient is written by the instruction just before, or by
            # an earlier accumulation's neighbour (one op, two gradients).
            early &= inst["operands"][0] in written
        else:
            written = set(inst.get("results", []))
print(f"accumulations follow their gradients: {str(early).lower()}")
for buffer in buffers:
    rank = buffer.get("pipeline_rank")
    offsets = dict(zip(buffer["parameters"], buffer["offsets"]))
    for number, bucket in enumerate(buffer["buckets"]):
        end = bucket["offset"] + bucket["size"]
        members = [p for p, o in offsets.items()
                   if bucket["offset"] <= o < end]
        where = sorted(a for p in members for a in accumulated.get(p, []))
        ready = bucket.get("ready_after")
        if ready:
            last = where[-1] == (ready["function"], ready["instruction"])
            start = (f"after {ready['function']}[{ready['instruction']}], "
                     f"its last accumulation: {str(last).lower()}")
        else:
            start = "after the step"
        prefix = "" if rank is None else f"pipeline rank {rank} "
        print(f"{prefix}bucket {number}: [{bucket['offset']}, {end}), "
              f"{len(members)} parameters, {start}")

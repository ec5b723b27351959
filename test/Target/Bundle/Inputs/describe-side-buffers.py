"""Describes the side buffers of a bundle manifest's train_step
(megatron-compile --emit plan) by op: one line per op and kind (kernel
block or bf16 copy), with how many, their bytes (each distinct size) and the
ops of the instructions that read them last.

Usage: describe-side-buffers.py MANIFEST.json
"""
import collections
import json
import sys

manifest = json.load(open(sys.argv[1]))
fn = next(f for f in manifest["functions"] if f["name"] == "train_step")
ops = [inst["op"] for inst in fn["instructions"]]
defined = {}
for inst in fn["instructions"]:
    for r in inst.get("results", []):
        defined[r] = inst["op"]
groups = collections.defaultdict(list)
for position, offset, size, until, copy_of in fn["memory_plan"]["side_buffers"]:
    if copy_of < 0:
        key = f"{ops[position]}: kernel"
    else:
        key = f"{ops[position]}: copy of a {defined.get(copy_of, 'input')}"
    groups[key].append((size, ops[until] if until != position else "itself"))
for key in sorted(groups):
    sizes = sorted({size for size, _ in groups[key]})
    ends = sorted({end for _, end in groups[key]})
    print(f"{key}: {len(groups[key])} x {'/'.join(map(str, sizes))} bytes, "
          f"until {'/'.join(ends)}")

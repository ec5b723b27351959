#!/usr/bin/env python3
"""Checks --report memory's MoE rows against the bundle they describe
(megatron-compile --emit plan of the same flags; report-memory-moe.test):
the routed experts' elements are the rank's shares of the parameter table's
`*.mlp.experts.*` tensors (each dimension over its split axes' ranks), their
bytes 4 per element, their gradients and moments 12 (4 without the
gradients when those live in the arena), the formula's count the same
without tensor parallelism; the all-to-all row counts and sums the bundle's
train_step all_to_all results (their largest named); the MoE rows saved are
positive and within the layers' saved bytes. Under expert parallelism the
experts are E/ep per rank.

Usage: moe-report-consistent.py REPORT PLAN.json
"""
import json
import re
import sys

text = open(sys.argv[1]).read()
manifest = json.load(open(sys.argv[2]))
grid = manifest.get("grid", {"shape": []})["shape"]
SIZES = {"f32": 4, "bf16": 2, "i32": 4, "f16": 2}
checks = 0


def fail(message):
    sys.exit(message + "\n" + text)


def check(ok, message):
    global checks
    if not ok:
        fail(message)
    checks += 1


def row(label):
    match = re.search(r"\n  " + re.escape(label) + r"\s+(\d+)", text)
    if not match:
        fail(f"no row '{label}' in the report")
    return int(match.group(1))


experts = 0
for p in manifest["parameters"]:
    if ".mlp.experts." not in p["name"]:
        continue
    elements = 1
    for size, axes in zip(p["shape"], p.get("split_axes", [[]] * len(p["shape"]))):
        ranks = 1
        for axis in axes:
            ranks *= grid[axis]
        elements *= size // ranks
    experts += elements
match = re.search(r"\n    of which routed experts \((\d+)\)\s+(\d+)\s+\S+ \S+\s+(\d+):", text)
if not match:
    fail("no routed experts row")
check(int(match.group(1)) == experts,
      f"routed experts {match.group(1)}, the bundle's {experts}")
check(int(match.group(2)) == 4 * experts, "routed experts' bytes")
if "tp 1," in text:
    check(int(match.group(3)) == experts, "the formula's routed experts")
in_arena = "gradients (fp32, in the arena)" in text
moments = row("  experts' gradients, moments")
check(moments == (8 if in_arena else 12) * experts,
      f"experts' gradients and moments {moments} for {experts} elements")

train = next(f for f in manifest["functions"] if f["name"] == "train_step")
sizes = []
for inst in train["instructions"]:
    if inst["op"] == "all_to_all":
        value = train["values"][inst["results"][0]]
        n = 1
        for d in value["shape"]:
            n *= d
        sizes.append(n * SIZES[value["dtype"]])
if "ep 1" in text or ", ep " not in text:
    check(sizes == [] and "all-to-all results" not in text,
          "all-to-alls without expert parallelism")
else:
    match = re.search(r"\n    all-to-all results \((\d+)\)\s+(\d+)\s+\S+ \S+\s+"
                      r"a micro-batch, largest ([0-9.]+ \S+);", text)
    if not match:
        fail("no all-to-all row")
    check(int(match.group(1)) == len(sizes), "all-to-all count")
    check(int(match.group(2)) == sum(sizes), "all-to-all bytes")
    largest = max(sizes)
    check(match.group(3) == (f"{largest / 1024:.2f} KiB" if largest < 1 << 20
                             else f"{largest / (1 << 20):.2f} MiB"),
          "largest all-to-all")
rows = row("  of which MoE rows saved")
layers = sum(int(n) for n in re.findall(r"\n  layer \d+\s+(\d+)", text))
check(0 < rows <= layers, f"MoE rows saved {rows}, the layers' {layers}")
print(f"consistent ({checks} checks): {experts} routed expert elements, "
      f"{len(sizes)} all-to-alls of {sum(sizes)} bytes")

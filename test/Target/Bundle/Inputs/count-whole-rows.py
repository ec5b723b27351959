"""Counts each function's GEMM instructions (linear*) of a manifest (from
megatron-compile --emit plan) by op, operand and result types and their
`whole_rows` attribute ("-" when absent), one line per kind, sorted.

Usage: count-whole-rows.py MANIFEST.json
"""
import collections
import json
import sys

manifest = json.load(open(sys.argv[1]))
for fn in manifest["functions"]:
    values = fn["values"]

    def typed(v):
        value = values[v]
        return "x".join(map(str, value["shape"])) + "x" + value["dtype"]

    kinds = collections.Counter()
    for inst in fn["instructions"]:
        if not inst["op"].startswith("linear"):
            continue
        rows = inst.get("attrs", {}).get("whole_rows", "-")
        kinds[(inst["op"], typed(inst["operands"][0]),
               typed(inst["results"][0]), str(rows))] += 1
    for (op, x, y, rows), count in sorted(kinds.items()):
        print(f"{fn['name']}: {op} {x} -> {y} whole_rows {rows}: {count}")

"""Prints the attention views of each function's memory plan (a manifest
from megatron-compile --emit plan; docs/BundleFormat.md, `views`): the
arena, then per group its whole (the op defining it, its type) and each view
by the op defining it and its byte offset in the whole's block.

Usage: describe-views.py MANIFEST.json
"""
import json
import sys

manifest = json.load(open(sys.argv[1]))
for fn in manifest["functions"]:
    plan = fn["memory_plan"]
    producer = {}
    for inst in fn["instructions"]:
        for r in inst.get("results", []):
            producer[r] = inst["op"]

    def typed(v):
        value = fn["values"][v]
        return "x".join(map(str, value["shape"])) + "x" + value["dtype"]

    groups = {}
    for v, whole, offset in plan["views"]:
        groups.setdefault(whole, []).append((v, offset))
    print(f"{fn['name']}: arena {plan['arena_bytes']} bytes, "
          f"{len(plan['views'])} views in {len(groups)} groups")
    for whole, views in groups.items():
        members = ", ".join(f"{producer[v]} {typed(v)} at {offset}"
                            for v, offset in sorted(views, key=lambda m: m[0]))
        print(f"  {producer[whole]} {typed(whole)}: {members}")

"""Prints, for held-attention-output.test, the attention's kernel block
and where the mul and add results lie against their operands.

Usage: describe-held-output.py BUNDLE
"""
import json
import struct
import sys

data = open(sys.argv[1], "rb").read()
manifest_size = struct.unpack("<Q", data[16:24])[0]
manifest = json.loads(data[64 : 64 + manifest_size])
fn = manifest["functions"][0]
plan = fn["memory_plan"]
ops = [inst["op"] for inst in fn["instructions"]]
for position, offset, size, until, copy_of in plan["side_buffers"]:
    if ops[position] == "attention" and copy_of < 0:
        print(f"attention block {size} bytes, until {ops[until]}")
offsets = plan["offsets"]
for inst in fn["instructions"]:
    if inst["op"] in ("mul", "add"):
        same = [v for v in inst["operands"] if offsets[v] == offsets[inst["results"][0]]]
        if same:
            source = next(i["op"] for i in fn["instructions"] if same[0] in i["results"])
            print(f"{inst['op']}: in place of {source}")
        else:
            print(f"{inst['op']}: own bytes")

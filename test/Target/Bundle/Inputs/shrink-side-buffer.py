"""Writes a copy of a bundle whose train_step memory plan gives the kernel
block of the first instruction of one op 256 bytes less (or, with
--drop, none at all), with the container's sizes and SHA-256 rewritten
(docs/BundleFormat.md): a plan that lacks what the CUDA backend needs.

Usage: shrink-side-buffer.py BUNDLE OP OUT [--drop]
"""
import hashlib
import json
import struct
import sys

data = open(sys.argv[1], "rb").read()
op, out = sys.argv[2], sys.argv[3]
drop = "--drop" in sys.argv[4:]
version, flags, manifest_size, payload_size = struct.unpack("<IIQQ", data[8:32])
manifest = json.loads(data[64 : 64 + manifest_size])
payload = data[64 + manifest_size :]
fn = next(f for f in manifest["functions"] if f["name"] == "train_step")
ops = [inst["op"] for inst in fn["instructions"]]
sides = fn["memory_plan"]["side_buffers"]
at = next(i for i, side in enumerate(sides) if ops[side[0]] == op and side[4] < 0)
print(f"instructions[{sides[at][0]}] ({op}): {sides[at][2]} bytes", end="")
if drop:
    del sides[at]
    print(", dropped")
else:
    sides[at][2] -= 256
    print(f", now {sides[at][2]}")
body = json.dumps(manifest).encode() + payload
header = b"MTBUNDLE" + struct.pack("<IIQQ", version, flags,
                                   len(body) - len(payload), len(payload))
open(out, "wb").write(header + hashlib.sha256(body).digest() + body)

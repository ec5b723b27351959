"""Writes a copy of a bundle whose train_step memory plan has other
attention views (docs/BundleFormat.md, `views`), with the container's sizes
and SHA-256 rewritten:
  shift: the first group's last view and its offset 16 bytes further (a
         plan the reader finds safe, at a place the flash kernels do not
         read);
  stale: the first view's byte offset 16 bytes further, its offset as it
         was (the two disagree);
  drop:  no `views`: the pieces inside their whole undeclared.

Usage: edit-views.py BUNDLE shift|stale|drop OUT
"""
import hashlib
import json
import struct
import sys

data = open(sys.argv[1], "rb").read()
mode, out = sys.argv[2], sys.argv[3]
version, flags, manifest_size, payload_size = struct.unpack("<IIQQ", data[8:32])
manifest = json.loads(data[64 : 64 + manifest_size])
payload = data[64 + manifest_size :]
fn = next(f for f in manifest["functions"] if f["name"] == "train_step")
plan = fn["memory_plan"]
views = plan["views"]
if mode == "shift":
    whole = views[0][1]
    last = max(i for i, view in enumerate(views) if view[1] == whole)
    views[last][2] += 16
    plan["offsets"][views[last][0]] += 16
    print(f"value {views[last][0]} now at byte {views[last][2]} of {whole}")
elif mode == "stale":
    views[0][2] += 16
    print(f"value {views[0][0]}: byte offset {views[0][2]}")
else:
    del plan["views"]
    print("views dropped")
body = json.dumps(manifest).encode() + payload
header = b"MTBUNDLE" + struct.pack("<IIQQ", version, flags,
                                   len(body) - len(payload), len(payload))
open(out, "wb").write(header + hashlib.sha256(body).digest() + body)

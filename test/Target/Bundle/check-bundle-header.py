#!/usr/bin/env python3
"""Checks a bundle's container (docs/BundleFormat.md) independently of the
writer and prints a summary of its manifest for FileCheck.

Usage: check-bundle-header.py BUNDLE [--attrs OP]...

--attrs OP also prints each instruction OP with its attributes (keys sorted).
"""
import hashlib
import json
import struct
import sys

shown_ops = [sys.argv[i + 1] for i in range(2, len(sys.argv) - 1) if sys.argv[i] == "--attrs"]
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"MTBUNDLE", f"magic {data[:8]!r}"
version, flags, manifest_size, payload_size = struct.unpack("<IIQQ", data[8:32])
assert len(data) == 64 + manifest_size + payload_size, "sizes do not add up"
assert hashlib.sha256(data[64:]).digest() == data[32:64], "SHA-256 mismatch"
manifest = json.loads(data[64 : 64 + manifest_size])
print(f"version {version} flags {flags} payload {payload_size}")
print(f"parameters {len(manifest['parameters'])}")
if "grid" in manifest:
    print(f"grid {manifest['grid']['shape']}")
    for parameter in manifest["parameters"]:
        if any(parameter.get("split_axes", [])):
            print(f"split {parameter['name']} {parameter['shape']} {parameter['split_axes']}")
if "kernels" in manifest:
    # The fused kernels' blobs lie inside the payload; print their names and
    # check the source names every entry point.
    kernels = manifest["kernels"]
    payload = data[64 + manifest_size :]
    blobs = {}
    for key in ("cubin", "ptx", "source"):
        offset, size = kernels[key]["offset"], kernels[key]["size"]
        assert 0 <= offset and offset + size <= payload_size, f"{key} outside the payload"
        blobs[key] = payload[offset : offset + size]
    assert blobs["cubin"][:4] == b"\x7fELF", "the cubin is not an ELF file"
    for name in kernels["names"]:
        assert f"__global__ void __launch_bounds__(256)\n{name}(".encode() in blobs["source"], name
        assert f".entry {name}(".encode() in blobs["ptx"], f"{name} not in the PTX"
    print(f"kernels {kernels['arch']} {kernels['names']}")
for function in manifest["functions"]:
    values = function["values"]
    defined = set(function["inputs"])
    for instruction in function["instructions"]:
        for operand in instruction.get("operands", []):
            assert operand in defined, f"{function['name']}: {operand} used before definition"
        inner = set(instruction.get("operands", []))
        for op in instruction.get("body", []):
            for operand in op.get("operands", []):
                assert operand in inner, f"{function['name']}: {operand} read outside its group"
            inner.update(op.get("results", []))
        if instruction["op"] == "fused":
            assert set(instruction["results"]) <= inner, "a group result nothing defines"
        defined.update(instruction.get("results", []))
    ops = [i["op"] for i in function["instructions"]]
    groups = [[o["op"] for o in i["body"]] for i in function["instructions"] if i["op"] == "fused"]
    if groups:
        print(f"{function['name']} groups: " + ", ".join(sorted(set(f"{groups.count(g)} x {'+'.join(g)}" for g in groups))))
    collectives = sum(ops.count(op) for op in ("all_reduce", "all_gather", "reduce_scatter", "shift"))
    print(
        f"{function['name']}: {len(values)} values, {len(ops)} instructions, "
        f"{ops.count('accumulate_gradient')} gradients, "
        f"outputs {[values[o]['shape'] for o in function['outputs']]}"
        + (f", {collectives} collectives" if "grid" in manifest else "")
    )
    for instruction in function["instructions"]:
        if instruction["op"] in shown_ops:
            print(f"{instruction['op']} {json.dumps(instruction.get('attrs', {}), sort_keys=True)}")

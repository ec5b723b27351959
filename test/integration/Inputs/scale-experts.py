#!/usr/bin/env python3
"""Writes a copy of a safetensors file whose routed experts' down_proj
weights (names with "mlp.experts." and "down_proj") are FACTOR times
larger, as F64 (exact), the other tensors as they are (moe-topk-scaling.test).

Usage: scale-experts.py IN.safetensors OUT.safetensors FACTOR
Prints the names it scaled; exits 1 if none.
"""
import json
import struct
import sys

from safetensors_file import read_tensors


def main():
    source, target, factor = sys.argv[1], sys.argv[2], float(sys.argv[3])
    header, body, scaled = {}, b"", []
    for name, (dtype, shape, raw) in sorted(read_tensors(source).items()):
        if "mlp.experts." in name and "down_proj" in name:
            if dtype != "F32":
                sys.exit("%s: %s is %s, expected F32" % (source, name, dtype))
            values = struct.unpack("<%df" % (len(raw) // 4), raw)
            raw = struct.pack("<%dd" % len(values),
                              *(factor * v for v in values))
            dtype = "F64"
            scaled.append(name)
        header[name] = {"dtype": dtype, "shape": shape,
                        "data_offsets": [len(body), len(body) + len(raw)]}
        body += raw
    if not scaled:
        sys.exit("%s: no routed experts' down_proj weights" % source)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(target, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + body)
    print("scaled by %g: %s" % (factor, ", ".join(scaled)))


if __name__ == "__main__":
    main()

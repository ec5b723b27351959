"""Reads safetensors files for the integration tests' checkers
(check-hf-directory.py, compare-safetensors.py, compare-weights.py): the
8-byte little-endian header length, the JSON header, then the tensors' bytes
at the header's data_offsets. __metadata__ is left out.
"""
import json
import struct
import sys


def read_tensors(path):
    """{name: (dtype, shape, raw bytes)} of every tensor in PATH."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    return {name: (t["dtype"], t["shape"],
                   body[t["data_offsets"][0]:t["data_offsets"][1]])
            for name, t in header.items()}


def read_float32(path, f64=False):
    """{name: (shape, raw F32 bytes, values)} of PATH, whose tensors must be
    F32; with F64, F64 tensors are taken as their rounding to float32. Exits
    naming the tensor otherwise."""
    out = {}
    for name, (dtype, shape, raw) in read_tensors(path).items():
        if f64 and dtype == "F64":
            values = struct.unpack("<%dd" % (len(raw) // 8), raw)
            raw = struct.pack("<%df" % len(values), *values)
        elif dtype != "F32":
            sys.exit("%s: %s is %s, expected F32" % (path, name, dtype))
        out[name] = (shape, raw,
                     struct.unpack("<%df" % (len(raw) // 4), raw))
    return out

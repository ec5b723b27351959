#!/usr/bin/env python3
"""Reads and edits the fused kernels' cache (lib/Target/Bundle/KernelCache.h)
independently of megatron-compile, for kernel-cache.test.

An entry, llvmcache-KEY: b"MTKERNEL", the SHA-256 of everything after it,
the cubin's and the PTX's sizes (64-bit little-endian), the cubin, the PTX.

Usage: kernel-cache.py entries FOLDER   prints the entries and whether their
                                        checksums and sizes hold
       kernel-cache.py plant FOLDER     rewrites the one entry with another,
                                        well-formed, cubin and PTX
       kernel-cache.py damage FOLDER    flips the first byte of the one entry's cubin
       kernel-cache.py kernels BUNDLE   prints the bundle's cubin and PTX
                                        when they are the planted ones, else
                                        their sizes
"""
import hashlib
import json
import os
import struct
import sys

PLANTED_CUBIN = b"\x7fELF planted cubin"
PLANTED_PTX = b"// planted ptx\0"


def entries(folder):
    return sorted(os.path.join(folder, name) for name in os.listdir(folder)
                  if name.startswith("llvmcache-"))


def well_formed(data):
    if data[:8] != b"MTKERNEL" or len(data) < 56:
        return False
    cubin, ptx = struct.unpack("<QQ", data[40:56])
    return (hashlib.sha256(data[40:]).digest() == data[8:40] and
            56 + cubin + ptx == len(data))


def entry(cubin, ptx):
    body = struct.pack("<QQ", len(cubin), len(ptx)) + cubin + ptx
    return b"MTKERNEL" + hashlib.sha256(body).digest() + body


def main():
    command, path = sys.argv[1:3]
    if command == "entries":
        found = entries(path)
        holds = all(well_formed(open(f, "rb").read()) for f in found)
        print(f"{len(found)} entries, checksums "
              f"{'hold' if holds else 'do not hold'}")
    elif command in ("plant", "damage"):
        (only,) = entries(path)
        data = bytearray(open(only, "rb").read())
        if command == "plant":
            data = entry(PLANTED_CUBIN, PLANTED_PTX)
        else:
            data[56] ^= 0x01
        open(only, "wb").write(bytes(data))
    elif command == "kernels":
        data = open(path, "rb").read()
        _, _, manifest_size, _ = struct.unpack("<IIQQ", data[8:32])
        kernels = json.loads(data[64:64 + manifest_size])["kernels"]
        payload = data[64 + manifest_size:]
        blob = {key: payload[kernels[key]["offset"]:kernels[key]["offset"] +
                             kernels[key]["size"]] for key in ("cubin", "ptx")}
        planted = (blob["cubin"] == PLANTED_CUBIN and
                   blob["ptx"] == PLANTED_PTX)
        print("planted kernels" if planted else
              f"cubin {len(blob['cubin'])} bytes, ptx {len(blob['ptx'])} bytes")


main()

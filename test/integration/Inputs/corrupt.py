#!/usr/bin/env python3
"""Writes damaged copies of files for bad-files.test.

Usage:
  corrupt.py flip IN OUT OFFSET     OUT is IN with the byte at OFFSET xor 0x01
  corrupt.py hostile-header IN OUT  OUT is IN with its safetensors header
                                    length field (the first 8 bytes) set to
                                    more than the whole file
  corrupt.py huge-header IN OUT     the same with 2^62, which a reader must
                                    refuse before allocating anything
"""
import struct
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    command, source, target = sys.argv[1:4]
    with open(source, "rb") as f:
        data = bytearray(f.read())
    if command == "flip" and len(sys.argv) == 5:
        data[int(sys.argv[4])] ^= 0x01
    elif command == "hostile-header" and len(sys.argv) == 4:
        data[0:8] = struct.pack("<Q", len(data) + 1000)
    elif command == "huge-header" and len(sys.argv) == 4:
        data[0:8] = struct.pack("<Q", 1 << 62)
    else:
        sys.exit(__doc__)
    with open(target, "wb") as f:
        f.write(bytes(data))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks that a file is a valid PNG of the expected size with a curve on it.

usage: check-png.py FILE WIDTH HEIGHT R,G,B

Decodes the PNG with the standard library only (zlib): the signature, every
chunk's CRC, IHDR (WIDTH x HEIGHT, 8-bit RGB, no interlace), the IDAT data
decompressed and unfiltered row by row (filters 0-4). Then counts the pixels
of colour R,G,B (the curve) and requires a curve across the plot: at least
100 such pixels in at least 200 distinct columns. Prints "FILE: W x H, N
curve pixels".
"""
import struct
import sys
import zlib


def fail(message):
    sys.exit("check-png: %s: %s" % (sys.argv[1], message))


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def main():
    path, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    colour = tuple(int(v) for v in sys.argv[4].split(","))
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail("not a PNG signature")
    at, chunks = 8, []
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        crc, = struct.unpack(">I", data[at + 8 + length:at + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            fail("bad CRC in chunk %r" % kind)
        chunks.append((kind, body))
        at += 12 + length
    if chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        fail("chunks do not start with IHDR and end with IEND")
    w, h, depth, colour_type, _, _, interlace = struct.unpack(
        ">IIBBBBB", chunks[0][1])
    if (w, h) != (width, height):
        fail("%d x %d, expected %d x %d" % (w, h, width, height))
    if depth != 8 or colour_type != 2 or interlace != 0:
        fail("expected 8-bit RGB without interlace")
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    stride = w * 3
    if len(raw) != h * (stride + 1):
        fail("image data of %d bytes, expected %d" % (len(raw),
                                                       h * (stride + 1)))
    previous = bytearray(stride)
    count, columns = 0, set()
    for y in range(h):
        kind = raw[y * (stride + 1)]
        row = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = row[i - 3] if i >= 3 else 0
            up = previous[i]
            corner = previous[i - 3] if i >= 3 else 0
            if kind == 1:
                row[i] = (row[i] + left) & 255
            elif kind == 2:
                row[i] = (row[i] + up) & 255
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 255
            elif kind == 4:
                row[i] = (row[i] + paeth(left, up, corner)) & 255
            elif kind != 0:
                fail("unknown filter %d in row %d" % (kind, y))
        for x in range(w):
            if tuple(row[3 * x:3 * x + 3]) == colour:
                count += 1
                columns.add(x)
        previous = row
    if count < 100 or len(columns) < 200:
        fail("only %d curve pixels in %d columns" % (count, len(columns)))
    print("%s: %d x %d, %d curve pixels" % (path.rsplit("/", 1)[-1], w, h,
                                            count))


main()

#!/usr/bin/env python3
"""Prints an indexed dataset (.bin/.idx) as text, one document per line.

Written from docs/IndexedDataset.md alone, with nothing but the standard
library, so that a test can check megatron-preprocess's output against the
documented layout rather than against the runtime's own reader.

usage: read-indexed-dataset.py PREFIX
prints: "type T sequences S documents N", then per document
"document d: sequence lengths [..] tokens t t t ...".
"""
import struct
import sys

TYPES = {1: ("B", "uint8"), 2: ("b", "int8"), 3: ("h", "int16"),
         4: ("i", "int32"), 5: ("q", "int64"), 6: ("d", "float64"),
         7: ("f", "float32"), 8: ("H", "uint16")}


def fail(message):
    sys.exit("read-indexed-dataset: " + message)


def main():
    prefix = sys.argv[1]
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    with open(prefix + ".bin", "rb") as f:
        binary = f.read()
    if idx[:9] != b"MMIDIDX\x00\x00":
        fail("bad magic")
    version, code, sequences, entries = struct.unpack_from("<QBQQ", idx, 9)
    if version != 1:
        fail("version %d" % version)
    if len(idx) != 34 + 12 * sequences + 8 * entries:
        fail("index size %d" % len(idx))
    fmt, name = TYPES[code]
    size = struct.calcsize(fmt)
    lengths = struct.unpack_from("<%di" % sequences, idx, 34)
    pointers = struct.unpack_from("<%dq" % sequences, idx, 34 + 4 * sequences)
    doc_index = struct.unpack_from("<%dq" % entries, idx, 34 + 12 * sequences)
    if doc_index[0] != 0 or doc_index[-1] != sequences:
        fail("document index %s" % (doc_index,))
    # The writer lays sequences out back to back.
    expected = 0
    for length, pointer in zip(lengths, pointers):
        if pointer != expected:
            fail("pointer %d, expected %d" % (pointer, expected))
        expected += length * size
    if expected != len(binary):
        fail(".bin has %d bytes, the index accounts for %d"
             % (len(binary), expected))
    print("type %s sequences %d documents %d" % (name, sequences, entries - 1))
    for d in range(entries - 1):
        tokens = []
        seq_lengths = []
        for s in range(doc_index[d], doc_index[d + 1]):
            seq_lengths.append(lengths[s])
            tokens += struct.unpack_from("<%d%s" % (lengths[s], fmt), binary,
                                         pointers[s])
        print("document %d: sequence lengths %s tokens %s"
              % (d, seq_lengths, " ".join(map(str, tokens))))


main()

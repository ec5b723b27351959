#!/usr/bin/env python3
"""Checks that the parameters a run on several ranks saved equal the one-rank
run's (pipeline-equivalence.test).

Usage: compare-checkpoints.py ONE_DIR RANKS_DIR [--exact] [--prefix=P]

Both are megatron-train --save directories. The latest iteration's
checkpoint.json of each names, per tensor, the safetensors shards and their
slices of the global tensor; every "model/" tensor is assembled from its
shards and compared: the norm of the difference must be within 1e-5 of the
tensor's norm (relative error, so that Adam's sign-sensitive updates of
elements whose gradient is near zero, which differ in the last bits between
layouts, do not dominate). With --exact every element must be equal, bit for
bit (runs that compute the same ops in the same order, such as a layout with
and without recomputation). --prefix=fp8/ compares the tensors under that
prefix instead of "model/" (FP8's scaling state). Prints what it compared;
exits 1 on a mismatch.
"""
import array
import json
import os
import struct
import sys

TOLERANCE = 1e-5


def latest(directory):
    with open(os.path.join(directory, "latest_checkpointed_iteration.txt")) as f:
        iteration = int(f.read().strip())
    return os.path.join(directory, "iter_%07d" % iteration)


def read_safetensors(path):
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        data = f.read()
    return header, data


def tensors(directory, prefix):
    iteration = latest(directory)
    with open(os.path.join(iteration, "checkpoint.json")) as f:
        manifest = json.load(f)
    files = {}
    result = {}
    for name, entry in manifest["tensors"].items():
        if not name.startswith(prefix):
            continue
        shape = entry["global_shape"]
        size = 1
        for d in shape:
            size *= d
        whole = array.array("f", bytes(4 * size))
        strides = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            strides[i] = strides[i + 1] * shape[i + 1]
        for shard in entry["shards"]:
            if shard["file"] not in files:
                files[shard["file"]] = read_safetensors(
                    os.path.join(iteration, shard["file"]))
            header, data = files[shard["file"]]
            info = header[name]
            begin, end = info["data_offsets"]
            piece = array.array("f")
            piece.frombytes(data[begin:end])
            offsets, local = shard["offsets"], shard["shape"]
            count = len(piece)
            for flat in range(count):
                index, rest = 0, flat
                for d in range(len(local) - 1, -1, -1):
                    coordinate = rest % local[d]
                    rest //= local[d]
                    index += (coordinate + offsets[d]) * strides[d]
                whole[index] = piece[flat]
        result[name] = whole
    return result


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    prefix = next((a.split("=", 1)[1] for a in sys.argv[1:]
                   if a.startswith("--prefix=")), "model/")
    noun = "parameters" if prefix == "model/" else "tensors"
    one, ranks = tensors(args[0], prefix), tensors(args[1], prefix)
    if "--exact" in sys.argv:
        for name in sorted(one):
            if one[name].tobytes() != ranks[name].tobytes():
                sys.exit("%s differs (--exact)" % name)
        print("%d %s, %d elements: identical" %
              (len(one), noun, sum(len(t) for t in one.values())))
        return
    if sorted(one) != sorted(ranks):
        sys.exit("the checkpoints hold different tensors: %s vs %s"
                 % (sorted(one), sorted(ranks)))
    worst, elements = 0.0, 0
    for name in sorted(one):
        a, b = one[name], ranks[name]
        scale = max(sum(x * x for x in a) ** 0.5, 1e-30)
        difference = sum((x - y) ** 2 for x, y in zip(a, b)) ** 0.5 / scale
        worst = max(worst, difference)
        elements += len(a)
        if difference > TOLERANCE:
            sys.exit("%s differs: relative error %.3g (norm %.6g) > %g"
                     % (name, difference, scale, TOLERANCE))
    print("%d %s, %d elements: equal within %g relative (largest "
          "relative error %.3g)" % (len(one), noun, elements, TOLERANCE,
                                    worst))


if __name__ == "__main__":
    main()

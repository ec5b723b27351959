#!/usr/bin/env python3
"""Prints which files of a checkpoint hold a tensor's pieces
(pipeline-tied-embeddings.test: a table tied across pipeline stages is saved
once, by its owner).

Usage: list-shards.py DIR TENSOR

DIR is a megatron-train --save directory; its latest iteration's
checkpoint.json is read. Prints "TENSOR: FILE [offsets] [shape]" per shard,
in the manifest's order; exits 1 when the tensor is missing.
"""
import json
import os
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    directory, name = sys.argv[1:]
    with open(os.path.join(directory, "latest_checkpointed_iteration.txt")) as f:
        iteration = int(f.read().strip())
    path = os.path.join(directory, "iter_%07d" % iteration, "checkpoint.json")
    with open(path) as f:
        tensors = json.load(f)["tensors"]
    if name not in tensors:
        sys.exit("%s: no tensor %s" % (path, name))
    for shard in tensors[name]["shards"]:
        print("%s: %s %s %s" % (name, shard["file"], shard["offsets"],
                                shard["shape"]))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Checks a directory megatron-checkpoint export-hf wrote (export-hf-directory.test).

Usage: check-hf-directory.py DIR MAX_SHARD_BYTES [SINGLE]

DIR holds config.json, generation_config.json and either model.safetensors
or model-0000K-of-0000N.safetensors shards with model.safetensors.index.json,
named and split as transformers' save_pretrained does: shards in name order,
each within MAX_SHARD_BYTES of tensor data unless it holds one tensor, the
index's weight_map naming each tensor's shard and its total_size the bytes
of every tensor. With SINGLE (another export's model.safetensors), the
shards together must hold its tensors bit for bit. Prints what it found;
exits 1 on the first mismatch.
"""
import json
import os
import sys

from safetensors_file import read_tensors


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    directory, limit = sys.argv[1], int(sys.argv[2])
    files = sorted(os.listdir(directory))
    for needed in ("config.json", "generation_config.json"):
        if needed not in files:
            fail("no %s in %s" % (needed, files))
        with open(os.path.join(directory, needed)) as f:
            json.load(f)
    shards = [f for f in files if f.endswith(".safetensors")]
    found = {}
    where = {}
    if shards == ["model.safetensors"]:
        if "model.safetensors.index.json" in files:
            fail("one shard, yet an index")
        found = read_tensors(os.path.join(directory, shards[0]))
        where = {name: shards[0] for name in found}
    else:
        count = len(shards)
        expected = ["model-%05d-of-%05d.safetensors" % (k + 1, count)
                    for k in range(count)]
        if shards != expected:
            fail("shards %s, expected %s" % (shards, expected))
        previous = ""
        for shard in shards:
            tensors = read_tensors(os.path.join(directory, shard))
            size = sum(len(t[2]) for t in tensors.values())
            if size > limit and len(tensors) > 1:
                fail("%s holds %d bytes in %d tensors, over %d"
                     % (shard, size, len(tensors), limit))
            names = sorted(tensors)
            if names[0] < previous:
                fail("%s starts at %s, before %s" % (shard, names[0], previous))
            previous = names[-1]
            for name in names:
                where[name] = shard
            found.update(tensors)
        with open(os.path.join(directory, "model.safetensors.index.json")) as f:
            index = json.load(f)
        if index["weight_map"] != where:
            fail("the index's weight_map differs from the shards' tensors")
        total = sum(len(t[2]) for t in found.values())
        if index["metadata"]["total_size"] != total:
            fail("total_size %s, the tensors hold %d bytes"
                 % (index["metadata"]["total_size"], total))
        print("%d shards, index of %d tensors, total_size %d: matches the shards"
              % (count, len(where), total))
    if len(sys.argv) == 4:
        single = read_tensors(sys.argv[3])
        if single != found:
            fail("the tensors differ from %s" % sys.argv[3])
        print("%d tensors: bit-identical to %s" % (len(found),
                                                  os.path.basename(sys.argv[3])))


if __name__ == "__main__":
    main()

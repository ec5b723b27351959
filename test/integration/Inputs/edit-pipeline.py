#!/usr/bin/env python3
"""Writes a copy of a pipeline bundle with its manifest edited, and the
header's lengths and SHA-256 made to match, for pipeline-bundle-errors.test:
the reader's own checks, not the container's, must catch what is wrong.

Usage: edit-pipeline.py IN OUT EDIT
  EDIT is one of:
    drop-stage        the pipeline's last stage entry removed
    swap-backward     stage 0's backward function named as stage 1's
    foreign-step      rank 0's first step given a stage of rank 1
    swap-recvs        rank 1's first two receives of activations swapped
                      (micro-batches 1 and 0), a schedule the compiler
                      would refuse
    untie-ranks       pipeline_ranks removed from every parameter: the
                      last stage reads a table tied to the first stage's
                      that its rank no longer holds
    aux-loss          stage 0 marked "aux_loss": true, whose forward's
                      output 1 is a stash tensor, not a scalar loss
    version-6         the manifest's and the header's version set to 6,
                      before pipeline_ranks existed
"""
import hashlib
import json
import struct
import sys


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    source, target, edit = sys.argv[1:]
    with open(source, "rb") as f:
        data = f.read()
    magic, version, flags, m, p = struct.unpack("<8sIIQQ", data[:32])
    manifest = json.loads(data[64:64 + m])
    payload = data[64 + m:64 + m + p]
    pipeline = manifest["pipeline"]
    if edit == "drop-stage":
        pipeline["stages"].pop()
    elif edit == "swap-backward":
        pipeline["stages"][0]["backward"] = pipeline["stages"][1]["backward"]
    elif edit == "foreign-step":
        pipeline["ranks"][0][0]["stage"] = 1
    elif edit == "swap-recvs":
        steps = pipeline["ranks"][1]
        recvs = [i for i, s in enumerate(steps)
                 if s["op"] == "recv_activation"][:2]
        a, b = recvs
        steps[a]["micro_batch"], steps[b]["micro_batch"] = (
            steps[b]["micro_batch"], steps[a]["micro_batch"])
        forwards = [i for i, s in enumerate(steps) if s["op"] == "forward"][:2]
        for i in forwards:
            steps[i]["micro_batch"] = 1 - steps[i]["micro_batch"]
    elif edit == "untie-ranks":
        for parameter in manifest["parameters"]:
            parameter.pop("pipeline_ranks", None)
    elif edit == "aux-loss":
        pipeline["stages"][0]["aux_loss"] = True
    elif edit == "version-6":
        manifest["version"] = version = 6
    else:
        sys.exit(__doc__)
    text = json.dumps(manifest).encode()
    body = text + payload
    header = struct.pack("<8sIIQQ", magic, version, flags, len(text), p)
    header += hashlib.sha256(body).digest()
    with open(target, "wb") as f:
        f.write(header + body)


if __name__ == "__main__":
    main()

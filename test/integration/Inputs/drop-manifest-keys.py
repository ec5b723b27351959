#!/usr/bin/env python3
"""Removes keys from a checkpoint manifest and hashes it again, making the
manifest of an older version (checkpoint-hf-round-trip.test).

Usage: drop-manifest-keys.py ITERATION_DIR SECTION KEY [KEY ...]

Deletes SECTION.KEY from ITERATION_DIR/checkpoint.json and sets
manifest_sha256 to the SHA-256 of the compact JSON with sorted keys without
it, as megatron-train writes it (docs/Checkpoints.md).
"""
import hashlib
import json
import os
import sys


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    path = os.path.join(sys.argv[1], "checkpoint.json")
    with open(path) as f:
        manifest = json.load(f)
    for key in sys.argv[3:]:
        del manifest[sys.argv[2]][key]
    del manifest["manifest_sha256"]
    compact = json.dumps(manifest, sort_keys=True, separators=(",", ":"),
                         ensure_ascii=False)
    manifest["manifest_sha256"] = hashlib.sha256(
        compact.encode("utf-8")).hexdigest()
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Compares the documents of an indexed dataset with the ids the `tokenizers`
library gave (ids.json of make-tokenizers.py).

usage: check-ids.py PREFIX IDS_JSON KEY...
Document d of PREFIX must hold the ids of KEY number d. Prints, per key,
"KEY: N ids equal", or the first difference with the ids around it, and
exits 1 if any differs.
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
READER = os.path.join(HERE, "..", "..", "tools", "Inputs",
                      "read-indexed-dataset.py")


def main():
    prefix, ids_file, keys = sys.argv[1], sys.argv[2], sys.argv[3:]
    with open(ids_file, encoding="utf-8") as f:
        expected = json.load(f)
    out = subprocess.run([sys.executable, READER, prefix], check=True,
                         capture_output=True, text=True).stdout.splitlines()
    documents = [line.split(" tokens")[1].split() if " tokens " in line
                 else [] for line in out[1:]]
    if len(documents) != len(keys):
        sys.exit("%d documents for %d keys" % (len(documents), len(keys)))
    failed = False
    for key, got in zip(keys, documents):
        got = [int(t) for t in got]
        want = expected[key]["ids"]
        if got == want:
            print("%s: %d ids equal" % (key, len(want)))
            continue
        failed = True
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b),
                  min(len(got), len(want)))
        print("%s: %d ids, expected %d; first difference at %d: got %s, "
              "expected %s" % (key, len(got), len(want), at,
                               got[max(0, at - 3):at + 5],
                               want[max(0, at - 3):at + 5]))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

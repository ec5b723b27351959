#!/usr/bin/env python3
"""Writes the paragraphs of a text file (blocks between blank lines) as JSONL
documents, {"text": ...} one per line, for megatron-preprocess.

Usage: tools/paragraphs-to-jsonl.py INPUT.txt OUTPUT.jsonl
"""
import json
import re
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip())
    with open(sys.argv[1], encoding="utf-8") as f:
        text = f.read()
    with open(sys.argv[2], "w", encoding="utf-8") as out:
        for paragraph in re.split(r"\n\s*\n", text):
            if paragraph.strip():
                record = {"text": paragraph.strip("\n") + "\n\n"}
                out.write(json.dumps(record, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

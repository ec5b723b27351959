"""Checks every pipeline rank's --report memory total against a limit in
bytes, and prints per rank the total and the activations beside
Megatron-LM's formula (production-models.test).

Usage: pipeline-totals.py REPORT LIMIT_BYTES
"""
import re
import sys

report = open(sys.argv[1]).read()
limit = int(sys.argv[2])
tables = re.split(r"\npipeline rank (\d+): ", report)[1:]
if not tables:
    sys.exit("no pipeline rank tables in the report")
lines = []
for rank, table in zip(tables[0::2], tables[1::2]):
    total = int(re.search(r"\n  total\s+(\d+)", table).group(1))
    if total >= limit:
        sys.exit(f"pipeline rank {rank}: total {total} bytes is not under "
                 f"{limit}")
    lines.append(f"rank {rank}: {total / 1e9:.2f} GB")
print(f"every pipeline rank's total is under {limit / 1e9:.0f} GB: " +
      "; ".join(lines))

"""Reads `megatron-compile --report memory` outputs, in order of more
recomputation, and checks that each one's activation peak and total are
below the previous one's (report-memory.test).

Usage: peaks-fall.py REPORT...
"""
import re
import sys


def figures(path):
    text = open(path).read()
    policy = re.search(r"recompute (.+?), \d+ rank", text).group(1)
    peak = int(re.search(r"activations \(train_step arena peak\)\s+(\d+)",
                         text).group(1))
    total = int(re.search(r"\n  total\s+(\d+)", text).group(1))
    return policy, peak, total


reports = [figures(path) for path in sys.argv[1:]]
for (before, peak0, total0), (after, peak1, total1) in zip(reports,
                                                          reports[1:]):
    if not (peak1 < peak0 and total1 < total0):
        sys.exit(f"recompute {after}: peak {peak1}, total {total1}; not below "
                 f"recompute {before}: peak {peak0}, total {total0}")
print("peaks fall: " + " > ".join(
    f"{policy} {peak / 2**30:.2f} GiB" for policy, peak, _ in reports))

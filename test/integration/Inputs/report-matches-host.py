"""Checks that what the host backend holds equals what the compiler reported
(report-matches-host.test): megatron-train's train_step arena against
--report memory's activations, its optimizer state against the report's.

Usage: report-matches-host.py REPORT TRAIN_LOG
"""
import re
import sys

report = open(sys.argv[1]).read()
log = open(sys.argv[2]).read()


def row(label):
    return int(re.search(r"\n  " + re.escape(label) + r"\s+(\d+)",
                         report).group(1))


policy = re.search(r"recompute (.+?), \d+ rank", report).group(1)
arena = int(re.search(r"train_step arena (\d+) bytes", log).group(1))
state = int(re.search(r"optimizer state (\d+) bytes", log).group(1))
for what, reported, held in (
        ("train_step arena", row("activations (train_step arena peak)"), arena),
        ("optimizer state", row("optimizer state (Adam moments)"), state)):
    if reported != held:
        sys.exit(f"recompute {policy}: {what}: the host holds {held} bytes, "
                 f"the report says {reported}")
print(f"recompute {policy}: the host's arena ({arena} bytes) and optimizer "
      f"state ({state} bytes) equal the report")

"""Checks that what the host backend holds equals what the compiler reported
(report-matches-host.test): megatron-train's train_step arena against
--report memory's activations, its optimizer state against the report's.
For a pipeline bundle, per pipeline rank: the arena its stage functions
share and the most stash it held at once (megatron-train's "pipeline
memory" line, the largest of each rank's tensor- and data-parallel
replicas) against the rank's table, and rank 0's optimizer state against
pipeline rank 0's.

Usage: report-matches-host.py REPORT TRAIN_LOG
"""
import re
import sys

report = open(sys.argv[1]).read()
log = open(sys.argv[2]).read()


def row(text, label):
    return int(re.search(r"\n  " + re.escape(label) + r"\s+(\d+)",
                         text).group(1))


def expect(what, reported, held):
    if reported != held:
        sys.exit(f"recompute {policy}: {what}: the host holds {held} bytes, "
                 f"the report says {reported}")


policy = re.search(r"recompute (.+?)(?: \(layers counted per stage\))?, "
                   r"\d+ rank", report).group(1)
state = int(re.search(r"optimizer state (\d+) bytes", log).group(1))
if "memory per pipeline rank" not in report:
    arena = int(re.search(r"train_step arena (\d+) bytes", log).group(1))
    expect("train_step arena", row(report, "activations (train_step arena peak)"),
           arena)
    expect("optimizer state", row(report, "optimizer state (Adam moments)"),
           state)
    print(f"recompute {policy}: the host's arena ({arena} bytes) and optimizer "
          f"state ({state} bytes) equal the report")
    sys.exit(0)

held = re.findall(r"rank (\d+): (\d+) \+ (\d+) bytes",
                  re.search(r"pipeline memory per pipeline rank.*", log).group(0))
tables = re.split(r"\npipeline rank \d+: ", report)[1:]
if not held or len(held) != len(tables):
    sys.exit(f"{len(held)} ranks in the log, {len(tables)} in the report")
for (rank, arena, stash), table in zip(held, tables):
    expect(f"pipeline rank {rank}'s shared arena",
           row(table, "arena (shared by its stages)"), int(arena))
    expect(f"pipeline rank {rank}'s stash",
           row(table, "stash (most held at once)"), int(stash))
    expect(f"pipeline rank {rank}'s activations = arena + stash",
           row(table, "activations (arena + stash)"), int(arena) + int(stash))
expect("rank 0's optimizer state",
       row(tables[0], "optimizer state (Adam moments)"), state)
print(f"recompute {policy}: per pipeline rank, the host's shared arena and "
      f"most stash held equal the report: " +
      "; ".join(f"rank {r}: {a} + {s} bytes" for r, a, s in held) +
      f"; rank 0's optimizer state {state} bytes too")

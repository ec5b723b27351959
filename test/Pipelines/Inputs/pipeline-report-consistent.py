"""Checks a pipeline bundle's --report memory against the bundle it
describes (megatron-compile --emit plan of the same flags), per pipeline
rank: the arena row is the largest arena_bytes of the rank's stages'
forward, backward and eval functions (they share one arena); the stash
row is the most stash the rank's steps in the bundle's schedule hold at
once (each forward adds the bytes of its function's outputs but the first,
each backward frees them), and the forward passes in flight the most
forwards whose backward is pending; activations = arena + stash; the
weights and the total are the sums of their rows.

Usage: pipeline-report-consistent.py REPORT PLAN.json
"""
import json
import re
import sys

report = open(sys.argv[1]).read()
manifest = json.load(open(sys.argv[2]))
functions = {fn["name"]: fn for fn in manifest["functions"]}
pipeline = manifest["pipeline"]
SIZES = {"f32": 4, "i32": 4, "i64": 8, "f64": 8, "bf16": 2, "f16": 2}


def row(text, label):
    match = re.search(r"\n  " + re.escape(label) + r"\s+(\d+)", text)
    if not match:
        sys.exit(f"no row '{label}' in the report")
    return int(match.group(1))


def stash_bytes(stage):
    fn = functions[pipeline["stages"][stage]["forward"]]
    total = 0
    for value in fn["outputs"][1:]:
        count = 1
        for d in fn["values"][value]["shape"]:
            count *= d
        total += count * SIZES[fn["values"][value]["dtype"]]
    return total


tables = re.split(r"\npipeline rank \d+: ", report)[1:]
if len(tables) != pipeline["size"]:
    sys.exit(f"{len(tables)} tables for {pipeline['size']} pipeline ranks")
lines = []
for rank, table in enumerate(tables):
    stages = [s for s in pipeline["stages"] if s["rank"] == rank]
    arenas = max(functions[s[part]]["memory_plan"]["arena_bytes"]
                 for s in stages for part in ("forward", "backward", "eval"))
    held = peak = passes = most = 0
    for step in pipeline["ranks"][rank]:
        if step["op"] == "forward":
            held += stash_bytes(step["stage"])
            passes += 1
        elif step["op"] == "backward":
            held -= stash_bytes(step["stage"])
            passes -= 1
        peak, most = max(peak, held), max(most, passes)
    weights = sum(row(table, label) for label in (
        re.search(r"\n  (parameters \(\d+, fp32\))", table).group(1),
        "gradients (fp32)", "optimizer state (Adam moments)"))
    checks = [
        ("arena", row(table, "arena (shared by its stages)") == arenas),
        ("stash", row(table, "stash (most held at once)") == peak),
        ("forward passes in flight",
         f"; at most {most} stage forward pass" in table),
        ("activations = arena + stash",
         row(table, "activations (arena + stash)") == arenas + peak),
        ("weights and optimizer = the sum of its rows",
         row(table, "weights and optimizer") == weights),
        ("total = the sum of its rows",
         row(table, "total") == weights + arenas + peak),
    ]
    failed = [name for name, ok in checks if not ok]
    if failed:
        sys.exit(f"pipeline rank {rank}: inconsistent report: " +
                 "; ".join(failed))
    lines.append(f"rank {rank}: {len(checks)} checks, {most} in flight")
print("consistent with the bundle: " + "; ".join(lines))

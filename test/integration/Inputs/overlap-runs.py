"""Compiles MODEL with and without overlapped communication, says how many
collectives the overlap moved in the bundles' instruction streams (and, for
--overlap-grad-reduce, how its gradient buckets lie), trains both bundles
3 iterations on the CPU (in-process ranks) and compares their logs and saved
weights bit for bit (overlap-bit-identical.test,
overlap-grad-reduce-bit-identical.test, overlap-every-flag-bit-identical.test).

Usage: overlap-runs.py MEGATRON_COMPILE MEGATRON_TRAIN SOURCE_ROOT MODEL
                       WORKDIR [--overlap FLAG]... [COMPILE_FLAG...]

Each --overlap FLAG is given to the overlapped bundle only (default:
--overlap-collectives); the COMPILE_FLAGs to both.
"""
import filecmp
from collections import Counter
import json
import os
import subprocess
import sys

from variant_runs import (compile_and_train, expect_same_losses,
                          in_process_ranks)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")

compile_tool, train_tool, root, model, work = sys.argv[1:6]
rest = sys.argv[6:]
overlap_flags = []
while rest[:1] == ["--overlap"]:
    overlap_flags.append(rest[1])
    rest = rest[2:]
overlap_flags = overlap_flags or ["--overlap-collectives"]
extra = rest
ranks = in_process_ranks(extra)
model_file = os.path.join(root, "models", model + ".yaml")
logs, weights, streams, plans = [], [], [], []
tag = f"{len(extra)}-{len(' '.join(overlap_flags))}"
for overlap in (False, True):
    stem = os.path.join(work, f"{model}-{tag}-{str(overlap).lower()}")
    flags = (overlap_flags if overlap else []) + extra
    plan = json.loads(subprocess.run(
        [compile_tool, model_file, "--emit", "plan"] + flags, check=True,
        capture_output=True, text=True).stdout)
    plans.append(plan)
    # Each collective's position among the step functions' instructions
    # (the gradient buffer's reductions and gathers are functions of their
    # own, per bucket with buckets; with buckets the accumulate_gradient
    # instructions move up, between the others).
    steps = [f for f in plan["functions"]
             if not f["name"].startswith(("reduce_gradients",
                                          "gather_parameters"))]
    streams.append(({
        (function["name"], index): inst["op"]
        for function in steps
        for index, inst in enumerate(
            i for i in function["instructions"]
            if i["op"] != "accumulate_gradient")
        if inst["op"] in COLLECTIVES}, steps))
    log, weight = compile_and_train(compile_tool, train_tool, root,
                                    model_file, stem, flags, ranks,
                                    save_weights=True)
    logs.append(log)
    weights.append(weight)
(before, functions_before), (after, functions_after) = streams
same_count = sorted(before.values()) == sorted(after.values())
moved = sum(1 for key in after if before.get(key) != after[key])
# A wait moved down is no instruction: it shows as operands held longer,
# in the free lists and the memory plan.
changed = functions_before != functions_after
if same_count:
    print(f"collectives: {len(before)}, the same kinds after: true, "
          f"starts moved: {'yes' if moved else 'no'}, "
          f"plan changed: {str(changed).lower()}")
else:
    # --tp-comm-overlap: all-gathers and reduce-scatters cut into chunks.
    counts = [Counter(stream.values()) for stream in (before, after)]
    print(f"collectives: {len(before)}, in chunks after: {len(after)} (" +
          ", ".join(f"{kind} {counts[0][kind]} -> {counts[1][kind]}"
                    for kind in COLLECTIVES) + ")")
buffers = plans[1].get("gradient_buffers") or (
    [plans[1]["gradient_buffer"]] if "gradient_buffer" in plans[1] else [])
buckets = [b for buffer in buffers for b in buffer.get("buckets", [])]
if buckets:
    # Started inside the last micro-batch's step, or after it.
    inside = sum(1 for b in buckets if "ready_after" in b)
    print(f"gradient buckets: {len(buckets)} in {len(buffers)} buffers, "
          f"{inside} started inside the step, {len(buckets) - inside} after")
    # The distributed optimizer's per-bucket shards, and with
    # --overlap-param-gather where the next step gathers each bucket.
    gathers = [b for b in buckets if "gather_function" in b]
    overlapped = sum(1 for x in buffers if x.get("overlap_param_gather"))
    if gathers:
        line = f"per-bucket shards: {len(gathers)} buckets"
        if overlapped:
            before = [b["gather_before"]["instruction"] for b in gathers
                      if "gather_before" in b]
            line += (f"; gathered in the next step: {overlapped} buffers, "
                     f"{len(before)} buckets before a train_step instruction")
            if before:
                line += f" (from {min(before)} to {max(before)})"
        print(line)
expect_same_losses(logs)
print("saved weights identical: " +
      str(filecmp.cmp(weights[0], weights[1], shallow=False)).lower())

"""Compiles MODEL with and without --overlap-collectives, says how many
collectives the overlap pipeline moved in the bundles' instruction streams,
trains both bundles 3 iterations on the CPU (in-process ranks) and compares
their logs bit for bit (overlap-bit-identical.test).

Usage: overlap-runs.py MEGATRON_COMPILE MEGATRON_TRAIN SOURCE_ROOT MODEL
                       WORKDIR [COMPILE_FLAG...]
"""
import json
import os
import subprocess
import sys

from variant_runs import (compile_and_train, expect_same_losses,
                          in_process_ranks)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")

compile_tool, train_tool, root, model, work = sys.argv[1:6]
extra = sys.argv[6:]
ranks = in_process_ranks(extra)
model_file = os.path.join(root, "models", model + ".yaml")
logs, streams = [], []
for overlap in ("false", "true"):
    stem = os.path.join(work, f"{model}-{len(extra)}-{overlap}")
    flags = [f"--overlap-collectives={overlap}"] + extra
    plan = json.loads(subprocess.run(
        [compile_tool, model_file, "--emit", "plan"] + flags, check=True,
        capture_output=True, text=True).stdout)
    # Each collective's position among the function's instructions.
    streams.append(({
        (function["name"], index): inst["op"]
        for function in plan["functions"]
        for index, inst in enumerate(function["instructions"])
        if inst["op"] in COLLECTIVES}, plan["functions"]))
    log, _ = compile_and_train(compile_tool, train_tool, root, model_file,
                               stem, flags, ranks)
    logs.append(log)
(before, functions_before), (after, functions_after) = streams
same_count = sorted(before.values()) == sorted(after.values())
moved = sum(1 for key in after if before.get(key) != after[key])
# A wait moved down is no instruction: it shows as operands held longer,
# in the free lists and the memory plan.
changed = functions_before != functions_after
print(f"collectives: {len(before)}, the same kinds after: "
      f"{str(same_count).lower()}, starts moved: {'yes' if moved else 'no'}, "
      f"plan changed: {str(changed).lower()}")
expect_same_losses(logs)

"""Compiles MODEL under each recomputation policy, trains each bundle 3
iterations on the CPU, and compares the logs and saved weights with the run
without recomputation (recompute-bit-identical.test).

Usage: recompute-runs.py MEGATRON_COMPILE MEGATRON_TRAIN SOURCE_ROOT MODEL WORKDIR
                         [COMPILE_FLAG...]
Extra flags go to every compilation; a bundle for several ranks trains them
as threads (--in-process-ranks).
"""
import filecmp
import os
import re
import subprocess
import sys

from variant_runs import (compile_and_train, expect_same_losses,
                          in_process_ranks)

compile_tool, train_tool, root, model, work = sys.argv[1:6]
extra = sys.argv[6:]
ranks = in_process_ranks(extra)
policies = [
    ("none", ["--recompute-granularity", "none"]),
    ("selective", ["--recompute-granularity", "selective"]),
    ("full uniform 1", ["--recompute-granularity", "full",
                        "--recompute-method", "uniform",
                        "--recompute-num-layers", "1"]),
    ("full uniform 2", ["--recompute-granularity", "full",
                        "--recompute-method", "uniform",
                        "--recompute-num-layers", "2"]),
    ("full block 1", ["--recompute-granularity", "full",
                      "--recompute-method", "block",
                      "--recompute-num-layers", "1"]),
]
model_file = os.path.join(root, "models", model + ".yaml")
logs, weights = [], []
for index, (name, flags) in enumerate(policies):
    stem = os.path.join(work, f"{model}-{len(extra)}-{index}")
    flags = flags + extra
    report = subprocess.run(
        [compile_tool, model_file, "--report", "memory"] + flags,
        check=True, capture_output=True, text=True).stdout
    print(f"{name}: " + re.search(r"recomputed: \d+ ops", report).group(0))
    log, weight = compile_and_train(compile_tool, train_tool, root,
                                    model_file, stem, flags, ranks)
    logs.append(log)
    weights.append(weight)
expect_same_losses(logs)
if ranks:  # megatron-train saves the weights of one-rank runs only
    sys.exit(0)
same = sum(filecmp.cmp(weights[0], other, shallow=False)
           for other in weights[1:])
print(f"saved weights identical: {same} of {len(weights) - 1}")

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

compile_tool, train_tool, root, model, work = sys.argv[1:6]
extra = sys.argv[6:]
ranks = ["--in-process-ranks"] if any("parallel-size" in f for f in extra) \
    else []
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
    subprocess.run([compile_tool, model_file, "-o", stem + ".mtb"] +
                   flags, check=True)
    subprocess.run(
        [train_tool, stem + ".mtb", "--data-path",
         os.path.join(root, "data", "corpus.txt"), "--train-iters", "3",
         "--lr", "1e-3", "--eval-interval", "0", "--no-progress-bar",
         "--log-jsonl", stem + ".jsonl"] +
        (ranks or ["--save-weights", stem + ".safetensors"]), check=True,
        stdout=subprocess.DEVNULL)
    logs.append(stem + ".jsonl")
    weights.append(stem + ".safetensors")
sys.stdout.flush()
subprocess.run([sys.executable,
                os.path.join(os.path.dirname(__file__), "same-losses.py")] +
               logs, check=True)
if ranks:  # megatron-train saves the weights of one-rank runs only
    sys.exit(0)
same = sum(filecmp.cmp(weights[0], other, shallow=False)
           for other in weights[1:])
print(f"saved weights identical: {same} of {len(weights) - 1}")

"""Trains MODEL 10 iterations on one rank and under pipeline layouts with
sequence parallelism and recomputation (pipeline-sp-recompute.test), and
compares: every layout's losses, evaluation loss and gradient norms with the
one-rank run's within 1e-5 relative (compare-ranks.py) and its saved
parameters likewise (compare-checkpoints.py); a layout with recomputation
with the same layout without it, bit for bit (losses and gradient norms as
logged, every saved parameter).

Usage: pipeline-variant-runs.py MEGATRON_COMPILE MEGATRON_TRAIN SOURCE_ROOT
                                MODEL WORKDIR [COMPILE_FLAG...]
Extra flags (the model's shape) go to every compilation.
"""
import os
import re
import subprocess
import sys

compile_tool, train_tool, root, model, work = sys.argv[1:6]
shape = sys.argv[6:]
here = os.path.dirname(os.path.abspath(__file__))
model_file = os.path.join(root, "models", model + ".yaml")

PP2 = ["--pipeline-model-parallel-size", "2", "--pipeline-schedule", "1f1b"]
SP = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
INTERLEAVED = ["--pipeline-model-parallel-size", "2",
               "--virtual-pipeline-model-parallel-size", "2",
               "--pipeline-schedule", "interleaved"]
SELECTIVE = ["--recompute-granularity", "selective"]
UNIFORM = ["--recompute-granularity", "full", "--recompute-method", "uniform",
           "--recompute-num-layers", "2"]
BLOCK = ["--recompute-granularity", "full", "--recompute-method", "block",
         "--recompute-num-layers", "1"]
# (name, flags, the run it equals bit for bit or None)
variants = [
    ("one", [], None),
    ("pp2", PP2, None),
    ("pp2-selective", PP2 + SELECTIVE, "pp2"),
    ("pp2-full-uniform-2", PP2 + UNIFORM, "pp2"),
    ("pp2-full-block-1", PP2 + BLOCK, "pp2"),
    ("pp2-tp2-sp", PP2 + SP, None),
    ("pp2-tp2-sp-interleaved", INTERLEAVED + SP, None),
    ("pp2-tp2-sp-selective", PP2 + SP + SELECTIVE, "pp2-tp2-sp"),
]


def run(command, **kwargs):
    result = subprocess.run(command, capture_output=True, text=True, **kwargs)
    if result.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def check(script, *args):
    return run([sys.executable, os.path.join(here, script)] + list(args))


for name, flags, same_as in variants:
    stem = os.path.join(work, f"{model}-{name}")
    flags = shape + flags
    report = run([compile_tool, model_file, "--report", "memory"] + flags)
    recomputed = sum(int(n) for n in
                     re.findall(r"recomputed: (\d+) ops", report))
    run([compile_tool, model_file, "-o", stem + ".mtb"] + flags)
    ranks = ["--in-process-ranks"] if name != "one" else []
    run([train_tool, stem + ".mtb", "--data-path",
         os.path.join(root, "data", "corpus.txt"), "--train-iters", "10",
         "--lr", "1e-3", "--adam-eps", "1e-6", "--log-interval", "1",
         "--eval-interval", "10", "--eval-iters", "1", "--no-progress-bar",
         "--log-jsonl", stem + ".jsonl", "--save", stem + ".ckpt"] + ranks)
    line = f"{name}: recomputed {recomputed} ops"
    if name != "one":
        one = os.path.join(work, f"{model}-one")
        losses = check("compare-ranks.py", one + ".jsonl", stem + ".jsonl",
                       "--grad-norm").strip()
        weights = check("compare-checkpoints.py", one + ".ckpt",
                        stem + ".ckpt").strip()
        line += f"; against one rank: {losses}; {weights}"
    if same_as:
        base = os.path.join(work, f"{model}-{same_as}")
        losses = check("compare-ranks.py", base + ".jsonl", stem + ".jsonl",
                       "--grad-norm", "--exact").strip()
        weights = check("compare-checkpoints.py", base + ".ckpt",
                        stem + ".ckpt", "--exact").strip()
        line += f"; against {same_as}: {losses}; {weights}"
    print(line, flush=True)

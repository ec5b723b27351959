"""Compiles MODEL with and without --fuse-linear-cross-entropy, counts the
output layer's ops in the train_step functions (a pipeline's stage functions
too), trains both bundles 3 iterations on
the CPU and checks that each iteration's loss and gradient norm agree within
a relative 1e-6 (linear-cross-entropy.test).

With --one-rank (tensor parallelism), the fused run is also compared with
the unfused one-rank run of the same model (the flags without
--tensor-model-parallel-size and --sequence-parallel), within the same
tolerance.

Usage: linear-cross-entropy-runs.py MEGATRON_COMPILE MEGATRON_TRAIN
                                    SOURCE_ROOT MODEL WORKDIR [--one-rank]
                                    [COMPILE_FLAG...]
"""
import collections
import json
import os
import subprocess
import sys

from variant_runs import compile_and_train, in_process_ranks

TOLERANCE = 1e-6

compile_tool, train_tool, root, model, work = sys.argv[1:6]
extra = sys.argv[6:]
one_rank = "--one-rank" in extra
extra = [flag for flag in extra if flag != "--one-rank"]
ranks = in_process_ranks(extra)
model_file = os.path.join(root, "models", model + ".yaml")
names = ("linear_cross_entropy", "scale", "cross_entropy",
         "cross_entropy_grad", "vocab_cross_entropy_grad", "linear_vocab_max",
         "linear_vocab_partials", "linear_vocab_cross_entropy_grad")
logs = []
for fused in ("false", "true"):
    stem = os.path.join(work, f"{model}-{len(extra)}-{fused}")
    flags = [f"--fuse-linear-cross-entropy={fused}"] + extra
    plan = json.loads(subprocess.run(
        [compile_tool, model_file, "--emit", "plan"] + flags, check=True,
        capture_output=True, text=True).stdout)
    ops = collections.Counter(
        inst["op"] for function in plan["functions"]
        if function["name"].startswith("train_step")
        for inst in function["instructions"])
    print(f"fused {fused}: " +
          " ".join(f"{name} {ops[name]}" for name in names))
    log, _ = compile_and_train(compile_tool, train_tool, root, model_file,
                               stem, flags, ranks)
    with open(log) as f:
        logs.append([json.loads(line) for line in f if line.strip()])



def compare(reference, fused, what):
    """The largest relative difference of the losses and gradient norms;
    exits when one is over TOLERANCE."""
    if len(reference) != len(fused) or not reference:
        sys.exit(f"{len(fused)} fused iterations, {len(reference)} {what}")
    worst = 0.0
    for ref, got in zip(reference, fused):
        for key in ("loss", "grad_norm"):
            a, b = ref[key], got[key]
            difference = abs(a - b) / max(abs(a), 1e-30)
            if difference > TOLERANCE:
                sys.exit(f"iteration {ref['iteration']}: {key} {b!r} fused, "
                         f"{a!r} {what} (relative difference "
                         f"{difference:.3g}, more than {TOLERANCE})")
            worst = max(worst, difference)
    return worst


reference, fused = logs
worst = compare(reference, fused, "unfused")
print(f"{len(reference)} iterations of losses and gradient norms within "
      f"{TOLERANCE} of the unfused run")
print(f"bit for bit: {str(worst == 0.0).lower()}")
print(f"largest relative difference: {worst:.3g}", file=sys.stderr)
if one_rank:
    single, skip = [], False
    for flag in extra:
        if skip:
            skip = False
        elif flag == "--tensor-model-parallel-size":
            skip = True
        elif not flag.startswith("--tensor-model-parallel-size=") and \
                flag != "--sequence-parallel":
            single.append(flag)
    log, _ = compile_and_train(
        compile_tool, train_tool, root, model_file,
        os.path.join(work, f"{model}-{len(extra)}-one-rank"),
        ["--fuse-linear-cross-entropy=false"] + single, [])
    with open(log) as f:
        alone = [json.loads(line) for line in f if line.strip()]
    worst = compare(alone, fused, "on one rank")
    print(f"{len(alone)} iterations within {TOLERANCE} of one rank")
    print(f"largest relative difference to one rank: {worst:.3g}",
          file=sys.stderr)

"""What composed-layouts.py and checkpoint-reshard-layouts.py share: the two
8-layer tiny models, a layout's name and megatron-compile flags, and the
comparison of two runs' saved parameters.

A layout is (pp, schedule, tp, sp, dp, distributed optimizer, recompute);
pp 1 is a layout without pipeline parallelism (its schedule is ignored).
Recompute is none, selective, full (uniform, one layer a group) or auto
(--memory-budget halfway between the layout's largest per-rank total
without recomputation and with selective recomputation, so the policy must
recompute).
"""
import importlib.util
import os
import re
import sys


def load(name, file):
    """The module in Inputs/`file` (a script name with hyphens)."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(name,
                                                  os.path.join(here, file))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


matrix = load("parallel_matrix", "parallel-matrix.py")

# Each model at 8 layers, made small enough for two cores.
MODELS = {
    "tiny-gpt": ["--num-layers", "8", "--seq-length", "64",
                 "--max-position-embeddings", "64"],
    "tiny-llama": ["--num-layers", "8", "--seq-length", "64"],
}
GLOBAL_BATCH = 8


def name_of(layout):
    pp, schedule, tp, sp, dp, dist, recompute = layout
    return "%stp%d%s-dp%d%s-%s" % ("pp%d-%s-" % (pp, schedule) if pp > 1
                                   else "", tp, "-sp" if sp else "", dp,
                                   "-distopt" if dist else "", recompute)


def micro_batch(layout):
    return 1 if layout[0] == 4 else 2


def ranks(layout):
    return layout[0] * layout[2] * layout[4]


def layout_flags(layout):
    pp, schedule, tp, sp, dp, dist, _ = layout
    flags = ["--tensor-model-parallel-size", str(tp),
             "--data-parallel-size", str(dp),
             "--micro-batch-size", str(micro_batch(layout)),
             "--global-batch-size", str(GLOBAL_BATCH)]
    if pp > 1:
        flags += ["--pipeline-model-parallel-size", str(pp),
                  "--pipeline-schedule", schedule]
    if schedule == "interleaved" and pp > 1:
        flags += ["--virtual-pipeline-model-parallel-size", "2"]
    if sp:
        flags.append("--sequence-parallel")
    if dist:
        flags.append("--use-distributed-optimizer")
    return flags


def largest_total(compiler, model, flags, work, name):
    """The largest per-rank total of --report memory, in bytes."""
    log = os.path.join(work, name + ".memory.txt")
    matrix.run([compiler, model] + flags + ["--report", "memory"], log)
    with open(log) as f:
        totals = [int(m.group(1)) for m in
                  re.finditer(r"^\s*total\s+(\d+)", f.read(), re.M)]
    if not totals:
        sys.exit("%s: --report memory printed no total" % log)
    return max(totals)


def recompute_flags(compiler, model, flags, work, name, recompute):
    if recompute == "none":
        return []
    if recompute == "selective":
        return ["--recompute-granularity", "selective"]
    if recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method",
                "uniform", "--recompute-num-layers", "1"]
    plain = largest_total(compiler, model, flags, work, name + "-none")
    selective = largest_total(
        compiler, model, flags + ["--recompute-granularity", "selective"],
        work, name + "-selective")
    if selective >= plain:
        sys.exit("%s: selective recomputation saves nothing (%d >= %d "
                 "bytes), so no budget forces it" % (name, selective, plain))
    return ["--memory-budget", str((plain + selective) // 2)]


def run_flags(compiler, model_dir, work, model_name, model_flags, layout,
              name):
    """The model file and megatron-compile's flags of a run."""
    model = os.path.join(model_dir, model_name + ".yaml")
    flags = model_flags + layout_flags(layout)
    return model, flags + recompute_flags(compiler, model, flags, work, name,
                                          layout[6])


def model_difference(one, other):
    """||one - other|| / ||one|| over every tensor of the model."""
    if sorted(one) != sorted(other):
        return float("inf")
    norm = error = 0.0
    for name in one:
        x, y = one[name][2], other[name][2]
        if one[name][0] != other[name][0]:
            return float("inf")
        norm += sum(a * a for a in x)
        error += sum((a - b) ** 2 for a, b in zip(x, y))
    return (error / max(norm, 1e-60)) ** 0.5

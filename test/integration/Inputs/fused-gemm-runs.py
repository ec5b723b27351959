"""Compiles MODEL with and without mt-fuse-gemm-epilogues (or another
fusion flag), counts the fused ops in the bundle's plan, trains both bundles
3 iterations on the CPU and compares their logs (and, for one rank, saved
weights) bit for bit (fuse-gemm-epilogues-bit-identical.test,
fuse-kernels-bit-identical.test).

Usage: fused-gemm-runs.py MEGATRON_COMPILE MEGATRON_TRAIN SOURCE_ROOT MODEL
                          WORKDIR [--toggle FLAG OP,OP...] [COMPILE_FLAG...]
  --toggle: the boolean megatron-compile flag to turn off and on (default
            fuse-gemm-epilogues) and the train_step ops to count
"""
import collections
import filecmp
import json
import os
import subprocess
import sys

from variant_runs import (compile_and_train, expect_same_losses,
                          in_process_ranks)

compile_tool, train_tool, root, model, work = sys.argv[1:6]
extra = sys.argv[6:]
toggle = "fuse-gemm-epilogues"
names = ("linear_gelu", "linear_gelu_grad", "linear_weight_bias_grad",
         "gelu", "gelu_grad", "bias_grad")
if extra[:1] == ["--toggle"]:
    toggle, names, extra = extra[1], tuple(extra[2].split(",")), extra[3:]
ranks = in_process_ranks(extra)
model_file = os.path.join(root, "models", model + ".yaml")
logs, weights = [], []
for fused in ("false", "true"):
    stem = os.path.join(work, f"{model}-{len(extra)}-{fused}")
    flags = [f"--{toggle}={fused}"] + extra
    plan = json.loads(subprocess.run(
        [compile_tool, model_file, "--emit", "plan"] + flags, check=True,
        capture_output=True, text=True).stdout)
    ops = collections.Counter(
        inst["op"] for function in plan["functions"]
        if function["name"] == "train_step"
        for inst in function["instructions"])
    print(f"fused {fused}: " +
          " ".join(f"{name} {ops[name]}" for name in names))
    log, weight = compile_and_train(compile_tool, train_tool, root,
                                    model_file, stem, flags, ranks)
    logs.append(log)
    weights.append(weight)
expect_same_losses(logs)
if not ranks:
    print("saved weights identical: " +
          str(filecmp.cmp(weights[0], weights[1], shallow=False)).lower())

"""Checks that a --report memory table agrees with itself and with the
bundle it describes (megatron-compile --emit plan of the same flags): the
activations row is train_step's arena in the bundle's memory plan, the eval
row eval_step's, the side buffers at the peak fit in the arena (and none is
a GEMM operand's copy: under bf16 the IR types the operands), the saved bytes by layer fit
in it, every GEMM's side buffer holds cuBLASLt's 32 MiB workspace (issue
21: no workspace beside the arena), the bf16 weight copies are the
parameters the bundle's GEMMs read (the runtime's rule), the weights (with
those copies under bf16) and the total are the sums
of their rows, and the device figure adds the measured CUDA
context.

Usage: report-consistent.py REPORT PLAN.json
"""
import json
import re
import sys

text = open(sys.argv[1]).read()
manifest = json.load(open(sys.argv[2]))


def row(label):
    match = re.search(r"\n  " + re.escape(label) + r"\s+(\d+)", text)
    if not match:
        sys.exit(f"no row '{label}' in the report")
    return int(match.group(1))


arena = {fn["name"]: fn["memory_plan"]["arena_bytes"]
         for fn in manifest["functions"]}
side = {fn["name"]: fn["memory_plan"]["side_buffers"]
        for fn in manifest["functions"]}
parameters = row(re.search(r"\n  (parameters \(\d+, fp32\))", text).group(1))
copies = re.search(r"\n  (bf16 weight copies \(\d+\))", text)
bf16_weights = row(copies.group(1)) if copies else 0
in_arena = "gradients (fp32, in the arena)" in text
gradients = row("gradients (fp32, in the arena)" if in_arena
                else "gradients (fp32)")
optimizer = row("optimizer state (Adam moments)")
activations = row("activations (train_step arena peak)")
side_at_peak = row("  of which side buffers at the peak")
layers = sum(int(n) for n in re.findall(r"\n  layer \d+\s+(\d+)", text))
other = row("embeddings and output layer")
bf16 = "precision bf16" in text
# The runtime's rule (runtime/src/cuda/ParameterStore.cpp,
# gemmReadParameters): a parameter has a bf16 copy when a GEMM of some
# function reads it as operand A or B straight from get_parameter; its
# elements are the rank's (the get_parameter value's shape).
GEMMS = {"linear", "linear_gelu", "linear_gelu_grad", "matmul",
         "linear_weight_grad", "linear_weight_bias_grad"}
read = {}
for fn in manifest["functions"]:
    parameter_of = {}
    for inst in fn["instructions"]:
        if inst["op"] == "get_parameter":
            parameter_of[inst["results"][0]] = inst["attrs"]["parameter"]
        # A master weight's cast to bf16 is the store's copy (version 8).
        if inst["op"] == "cast" and inst["operands"][0] in parameter_of:
            parameter_of[inst["results"][0]] = parameter_of[inst["operands"][0]]
        if inst["op"] in GEMMS:
            for v in inst["operands"][:2]:
                if v in parameter_of:
                    count = 1
                    for d in fn["values"][v]["shape"]:
                        count *= d
                    read[parameter_of[v]] = count
gemm_read_elements = sum(read.values())
# The CUDA trainer's rule (runtime/src/cuda/Trainer.cpp,
# ParameterStore::gradientsFitArena): the gradients live in train_step's
# arena with one micro-batch per iteration, no data-parallel gradient
# buffer, no loss scaling, and one f32 accumulate_gradient per parameter.
model = manifest["model"]
train = next(fn for fn in manifest["functions"] if fn["name"] == "train_step")
accumulated = [0] * len(manifest["parameters"])
f32_gradients = True
for inst in train["instructions"]:
    if inst["op"] == "accumulate_gradient":
        accumulated[inst["attrs"]["parameter"]] += 1
        f32_gradients &= train["values"][inst["operands"][0]]["dtype"] == "f32"
fits_arena = (model["global_batch_size"] == model["micro_batch_size"] *
              model["data_parallel_size"] and
              "gradient_buffer" not in manifest and
              model["precision"] != "fp16" and f32_gradients and
              all(count == 1 for count in accumulated))
copied = int(copies.group(1)[len("bf16 weight copies ("):-1]) if copies else 0

checks = [
    ("bf16 weight copies = the parameters the bundle's GEMMs read",
     not bf16 or copied == gemm_read_elements),
    ("activations = train_step's arena_bytes",
     activations == arena["train_step"]),
    ("eval_step arena = eval_step's arena_bytes",
     row("eval_step arena (when evaluating)") == arena.get("eval_step", 0)),
    ("side buffers at the peak within the arena",
     0 <= side_at_peak <= activations),
    # Under bf16 every GEMM operand is typed bf16 (mt-mixed-precision, an
    # mt.cast where it was f32): no side buffer is an operand copy.
    ("side buffers present, no operand copies",
     side["train_step"] and
     all(entry[4] < 0 for entry in side["train_step"])),
    ("saved by layer and outside within the arena",
     0 < layers + other <= activations),
    ("no workspace row: it is in the arena",
     "workspace (cuBLASLt)" not in text),
    ("every GEMM's side buffer holds the 32 MiB workspace",
     all(any(entry[0] == position and entry[4] < 0 and
             entry[2] >= 32 << 20 for entry in side[fn["name"]])
         for fn in manifest["functions"]
         for position, inst in enumerate(fn["instructions"])
         if inst["op"] in GEMMS)),
    ("gradients in the arena exactly where the runtime keeps them there",
     in_arena == fits_arena),
    ("gradients: none beside the arena, or every parameter's fp32",
     gradients == (0 if in_arena else parameters)),
    ("weights and optimizer = the sum of its rows",
     row("weights and optimizer") ==
     parameters + bf16_weights + gradients + optimizer),
    ("bf16 weight copies exactly under bf16, at most the parameters",
     (copies is not None) == bf16 and 2 * bf16_weights <= parameters),
    ("total = the sum of its rows",
     row("total") == parameters + bf16_weights + gradients + optimizer +
     activations),
    ("with the CUDA context = total + 535 MiB",
     row("  with the CUDA context") == row("total") + (535 << 20)),
]
failed = [name for name, ok in checks if not ok]
if failed:
    sys.exit("inconsistent report: " + "; ".join(failed))
policy = re.search(r"recompute (.+?), \d+ rank", text).group(1)
print(f"recompute {policy}: consistent ({len(checks)} checks), "
      f"{len(side['train_step'])} side buffers, gradients "
      f"{'in the arena' if in_arena else 'in a buffer'}")

#!/usr/bin/env python3
"""Runs tiny-gpt under every parallel layout and compares each run with the
one-rank run made here (multi-rank-matrix.test).

Usage: parallel-matrix.py MEGATRON_COMPILE MEGATRON_TRAIN MODEL DATA WORK_DIR

The layouts: tensor parallelism in {1, 2, 4} x sequence parallelism off and
on (on only with TP > 1) x data parallelism in {1, 2} x the distributed
optimizer off and on; at most 8 in-process ranks. Every layout trains 10
iterations (evaluating 2 batches after iterations 5 and 10) with the global micro-batch of 8 sequences, float32, the model's
dropout (GPT-2's 0.1 on the embeddings, the hidden states and the attention
probabilities). The vocabulary is padded to 512 rows everywhere (TP4 pads it
so) so that every run trains the same model.

Each run must agree with the one-rank run:
- every iteration's loss and gradient norm, and every evaluation loss,
  within 1e-5 relative;
- every saved tensor within 1e-5 relative in its own L2 norm:
  ||one - run|| <= 1e-5 ||one||, tensor by tensor.
AdamW runs with eps 1e-6 instead of 1e-8: with 1e-8 AdamW divides rounding
noise by its own magnitude where the exact gradient is zero (the key part of
c_attn's bias: the softmax does not see it), and that noise, which any
change of summation order changes, moves those elements by a sizeable part
of the learning rate (per tensor up to 1e-4 relative after 10 iterations,
while the whole model's L2 difference stays near 1e-6).

Each distributed-optimizer run must also save the same bits as the
replicated run of its layout (AdamW is elementwise; the reductions are in a
fixed order).

As a control the one-rank run without dropout must differ from the
reference: dropout is on, and the comparison can fail.

Prints one line per layout with its largest relative differences and a
summary; exits 1 if any layout differs.
"""
import importlib.util
import json
import os
import subprocess
import sys

TOLERANCE = 1e-5
TRAIN = ["--train-iters", "10", "--lr", "1e-3", "--adam-eps", "1e-6",
         "--log-interval", "1", "--eval-interval", "5", "--eval-iters", "2",
         "--no-progress-bar"]


def load_weights_reader():
    """safetensors_file.read_float32, beside this file."""
    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        "safetensors_file", os.path.join(here, "safetensors_file.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.read_float32


read_weights = load_weights_reader()


def layouts():
    for tp in (1, 2, 4):
        for sp in ((False, True) if tp > 1 else (False,)):
            for dp in (1, 2):
                for dist in (False, True):
                    if tp == dp == 1 and not dist:
                        continue  # the reference itself
                    yield tp, sp, dp, dist


def name_of(tp, sp, dp, dist):
    return "tp%d%s-dp%d%s" % (tp, "-sp" if sp else "", dp,
                              "-distopt" if dist else "")


def run(args, log):
    with open(log, "w") as out:
        result = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        with open(log) as f:
            sys.exit("%s failed (exit %d):\n%s"
                     % (" ".join(args), result.returncode, f.read()[-2000:]))


def train(tools, model, data, work, name, flags, ranks, extra=()):
    compiler, trainer = tools
    bundle = os.path.join(work, name + ".mtb")
    run([compiler, model] + list(flags) + ["-o", bundle],
        os.path.join(work, name + ".compile.log"))
    jsonl = os.path.join(work, name + ".jsonl")
    weights = os.path.join(work, name + ".st")
    run([trainer, bundle] +
        (["--in-process-ranks"] if ranks else []) +
        ["--data-path", data] + TRAIN + list(extra) +
        ["--log-jsonl", jsonl, "--save-weights", weights],
        os.path.join(work, name + ".train.log"))
    with open(jsonl) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return records, read_weights(weights)


def relative(x, y):
    return abs(x - y) / max(abs(x), 1e-30)


def compare_logs(one, other):
    """The largest relative difference of the losses (training and
    evaluation) and of the gradient norms, or None if the logs do not line
    up."""
    if len(one) != len(other) or not one:
        return None
    worst = {"loss": 0.0, "grad_norm": 0.0}
    for a, b in zip(one, other):
        for key, kind in (("loss", "loss"), ("eval_loss", "loss"),
                          ("grad_norm", "grad_norm")):
            if (key in a) != (key in b):
                return None
            if key in a:
                worst[kind] = max(worst[kind], relative(a[key], b[key]))
    return worst["loss"], worst["grad_norm"]


def compare_weights(one, other):
    """The largest per-tensor relative L2 difference and its tensor."""
    if sorted(one) != sorted(other):
        return float("inf"), "different tensors"
    worst = (0.0, "")
    for name in sorted(one):
        shape, _, x = one[name]
        other_shape, _, y = other[name]
        if shape != other_shape:
            return float("inf"), name + " has another shape"
        norm = sum(a * a for a in x)
        error = sum((a - b) ** 2 for a, b in zip(x, y))
        worst = max(worst, ((error / max(norm, 1e-60)) ** 0.5, name))
    return worst


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    tools, (model, data, work) = sys.argv[1:3], sys.argv[3:6]
    os.makedirs(work, exist_ok=True)
    one_logs, one_weights = train(
        tools, model, data, work, "one",
        ["--make-vocab-size-divisible-by", "512"], ranks=False)

    failures, worst = 0, {"loss": 0.0, "grad_norm": 0.0, "weights": 0.0}
    saved, same_bits = {"tp1-dp1": one_weights}, 0
    for tp, sp, dp, dist in layouts():
        name = name_of(tp, sp, dp, dist)
        flags = ["--make-vocab-size-divisible-by", str(512 // tp),
                 "--tensor-model-parallel-size", str(tp),
                 "--data-parallel-size", str(dp),
                 "--micro-batch-size", str(8 // dp)]
        if sp:
            flags.append("--sequence-parallel")
        if dist:
            flags.append("--use-distributed-optimizer")
        logs, weights = train(tools, model, data, work, name, flags,
                              ranks=tp * dp > 1)
        compared = compare_logs(one_logs, logs)
        if compared is None:
            print("%-22s FAIL: %d log records, the one-rank run has %d"
                  % (name, len(logs), len(one_logs)))
            failures += 1
            continue
        loss, norm = compared
        tensor_error, tensor = compare_weights(one_weights, weights)
        ok = max(loss, norm, tensor_error) <= TOLERANCE
        failures += not ok
        worst["loss"] = max(worst["loss"], loss)
        worst["grad_norm"] = max(worst["grad_norm"], norm)
        worst["weights"] = max(worst["weights"], tensor_error)
        print("%-22s %s: loss %.2g, grad norm %.2g, worst tensor %.2g (%s)"
              % (name, "ok" if ok else "FAIL", loss, norm, tensor_error,
                 tensor))
        # The distributed optimizer steps each element as the replicated
        # one does: the same bits as the replicated run of its layout.
        saved[name] = weights
        if dist:
            replicated = saved[name_of(tp, sp, dp, False)]
            if all(weights[t][1] == replicated[t][1] for t in replicated):
                same_bits += 1
            else:
                print("%-22s FAIL: not the bits of the replicated optimizer"
                      % name)
                failures += 1

    # The control: without dropout the losses differ from the reference's.
    control_logs, _ = train(
        tools, model, data, work, "one-without-dropout",
        ["--make-vocab-size-divisible-by", "512", "--hidden-dropout", "0",
         "--attention-dropout", "0"], ranks=False)
    control = compare_logs(one_logs, control_logs)
    if control is None or control[0] <= TOLERANCE:
        print("control FAIL: the run without dropout has the reference's "
              "losses")
        failures += 1
    else:
        print("control ok: without dropout the losses differ by %.2g"
              % control[0])

    count = sum(1 for _ in layouts())
    print("%d layouts, largest relative differences: loss %.2g, grad norm "
          "%.2g, per-tensor weights %.2g" % (count, worst["loss"],
                                            worst["grad_norm"],
                                            worst["weights"]),
          file=sys.stderr)
    if failures:
        sys.exit("%d of %d layouts differ from the one-rank run"
                 % (failures, count))
    print("%d layouts: losses, gradient norms and every saved tensor equal "
          "to the one-rank run within %g relative" % (count, TOLERANCE))
    print("%d distributed-optimizer layouts save the bits of the replicated "
          "optimizer's" % same_bits)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Trains tiny-gpt with dropout under several splits of the same global
batch and compares each run with one rank accumulating two micro-batches of
4 (dropout-micro-batch-splits.test).

Usage: dropout-splits.py MEGATRON_COMPILE MEGATRON_TRAIN MODEL DATA WORK_DIR

Every run trains 10 iterations (evaluating 2 batches after iterations 5
and 10) of the global batch of 8 sequences, float32, with the model's
dropout (GPT-2's 0.1 on the embeddings, the hidden states and the attention
probabilities), clipping off (parameters would depend on the gradient
norm's last bits through the clipping factor) and AdamW's eps 1e-6
(parallel-matrix.py says why). Dropout masks are keyed on the global sample
and the position within it (runtime/src/core/Random.h), so:

- "dp2" (two data ranks, micro-batch 4) saves the bits of "acc" (one rank
  accumulating micro-batches of 4) and logs the same float32 losses and
  the same gradient norms: a data rank's gradient is its micro-batch's and
  the 1/dp scaling is a power of two (docs/Parallelism.md, "Bit for bit");
- "dp2-tp2-sp" (two data ranks times tensor parallelism 2 with sequence
  parallelism) saves the bits of "acc" too and logs the same float32
  losses; its gradient norm sums the ranks' shards in another grouping
  (within 1e-6);
- "mb8" (one rank, one micro-batch of 8) computes the same model in another
  order of sums (the loss's mean over 8 sequences, not the mean of two
  means of 4): losses, gradient norms and the saved parameters within 1e-6
  relative (the parameters as one vector, in its L2 norm).

The vocabulary is padded to 512 rows in every run (the TP2 run's divisor
is 256), so that every run trains the same model. A control, so that the
comparisons can fail: the run without dropout has other losses than
"acc".

Prints one line per comparison; exits 1 if any fails.
"""
import json
import os
import struct
import sys

from layout_runs import matrix

TOLERANCE = 1e-6
TRAIN = ["--train-iters", "10", "--lr", "1e-3", "--adam-eps", "1e-6",
         "--clip-grad", "0", "--log-interval", "1", "--eval-interval", "5",
         "--eval-iters", "2", "--no-progress-bar"]

run, read_weights = matrix.run, matrix.read_weights


def train(tools, model, data, work, name, flags, ranks):
    compiler, trainer = tools
    bundle = os.path.join(work, name + ".mtb")
    run([compiler, model, "--global-batch-size", "8"] + list(flags) +
        ["-o", bundle],
        os.path.join(work, name + ".compile.log"))
    jsonl = os.path.join(work, name + ".jsonl")
    weights = os.path.join(work, name + ".st")
    run([trainer, bundle] + (["--in-process-ranks"] if ranks else []) +
        ["--data-path", data] + TRAIN +
        ["--log-jsonl", jsonl, "--save-weights", weights],
        os.path.join(work, name + ".train.log"))
    with open(jsonl) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return records, read_weights(weights)


def float32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def compare_logs(one, other, key):
    """The largest relative difference of `key` ("loss" also compares
    "eval_loss"), and whether every value has the same bits (losses as
    float32: a log averages micro-batches in double), or None if the logs
    do not line up."""
    keys = ("loss", "eval_loss") if key == "loss" else (key,)
    if len(one) != len(other) or not one:
        return None
    worst, same = 0.0, True
    for a, b in zip(one, other):
        for k in keys:
            if (k in a) != (k in b):
                return None
            if k not in a:
                continue
            x, y = float(a[k]), float(b[k])
            if k != "grad_norm":
                same = same and float32(x) == float32(y)
            else:
                same = same and x == y
            worst = max(worst, abs(x - y) / max(abs(x), 1e-30))
    return worst, same


def compare_weights(one, other):
    """The parameters' relative L2 difference as one vector, and whether
    every tensor has the same bits."""
    if sorted(one) != sorted(other):
        return float("inf"), False
    squares = errors = 0.0
    same = True
    for name in sorted(one):
        shape, raw, x = one[name]
        other_shape, other_raw, y = other[name]
        if shape != other_shape:
            return float("inf"), False
        same = same and raw == other_raw
        squares += sum(a * a for a in x)
        errors += sum((a - b) ** 2 for a, b in zip(x, y))
    return (errors / max(squares, 1e-60)) ** 0.5, same


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    tools, (model, data, work) = sys.argv[1:3], sys.argv[3:6]
    os.makedirs(work, exist_ok=True)
    one = ["--make-vocab-size-divisible-by", "512"]
    acc_logs, acc_weights = train(tools, model, data, work, "acc",
                                  one + ["--micro-batch-size", "4"],
                                  ranks=False)
    # (name, flags, in-process ranks, bits expected: loss, grad norm,
    # parameters)
    runs = [
        ("dp2", one + ["--micro-batch-size", "4", "--data-parallel-size", "2"],
         True, (True, True, True)),
        ("dp2-tp2-sp", ["--micro-batch-size", "4", "--data-parallel-size",
                        "2", "--tensor-model-parallel-size", "2",
                        "--sequence-parallel",
                        "--make-vocab-size-divisible-by", "256"],
         True, (True, False, True)),
        ("mb8", one + ["--micro-batch-size", "8"], False,
         (False, False, False)),
    ]
    failures = 0
    for name, flags, ranks, bits in runs:
        logs, weights = train(tools, model, data, work, name, flags, ranks)
        loss = compare_logs(acc_logs, logs, "loss")
        norm = compare_logs(acc_logs, logs, "grad_norm")
        if loss is None or norm is None:
            print("%-11s FAIL: %d log records, acc has %d"
                  % (name, len(logs), len(acc_logs)))
            failures += 1
            continue
        params, params_same = compare_weights(acc_weights, weights)
        ok = max(loss[0], norm[0], params) <= TOLERANCE
        expected = (loss[1], norm[1], params_same)
        for what, want, got in zip(("losses", "gradient norms", "parameters"),
                                   bits, expected):
            if want and not got:
                print("%-11s FAIL: the %s differ in their bits" % (name, what))
                ok = False
        failures += not ok

        def describe(difference, same):
            return "bit for bit" if same else "%.2g" % difference

        print("%-11s %s: losses %s, gradient norms %s, parameters %s"
              % (name, "ok" if ok else "FAIL", describe(*loss),
                 describe(*norm), describe(params, params_same)))

    # The control: without dropout the losses differ from acc's.
    control_logs, _ = train(
        tools, model, data, work, "acc-without-dropout",
        one + ["--micro-batch-size", "4", "--hidden-dropout", "0",
               "--attention-dropout", "0"], ranks=False)
    control = compare_logs(acc_logs, control_logs, "loss")
    if control is None or control[0] <= TOLERANCE:
        print("control FAIL: the run without dropout has acc's losses")
        failures += 1
    else:
        print("control ok: without dropout the losses differ by %.2g"
              % control[0])
    if failures:
        sys.exit("%d comparisons failed" % failures)


if __name__ == "__main__":
    main()

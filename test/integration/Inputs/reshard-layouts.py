#!/usr/bin/env python3
"""Saves a checkpoint in each of several composed layouts and resumes it in
every one of them (checkpoint-reshard-layouts.test).

Usage: reshard-layouts.py MEGATRON_COMPILE MEGATRON_TRAIN MODEL_DIR DATA
                          WORK_DIR [MODEL ...]

The layouts (layout_runs.py names them): TP2 x PP2 x DP2 with sequence
parallelism, the distributed optimizer and selective recomputation (1F1B);
TP1 x PP4 (1F1B); PP2 interleaved (2 virtual stages a rank); TP2 x DP2 with
the distributed optimizer; one rank. Between them a checkpoint changes every
cut: the tensor split of the weights and moments, the stages' layer ranges
(contiguous, interleaved, none), a table tied across stages or not, the
distributed optimizer's flat ranges of the moments and whole moments.

For each model (the 8-layer tiny-gpt, tied embeddings and dropout 0.1, and
the 8-layer tiny-llama of composed-layouts.py), each layout A trains 3
iterations and saves; each layout B then loads A's checkpoint and trains to
iteration 5, saving its parameters. All 25 pairs (A, B), the 5 same-layout
resumes among them, which are the references: B's run from A's checkpoint
must agree with A's own resume
- in every loss (iterations 4 and 5 and the evaluation after 5) and gradient
  norm within 1e-6 relative;
- in the saved parameters within 1e-6 relative in the L2 norm of all of
  them (||A - B|| <= 1e-6 ||A||); the worst single tensor is printed too;
and a resume into another layout must say that it reshards.
AdamW runs with eps 1e-6 (parallel-matrix.py says why).

Prints one line per pair, a summary per model (the worst differences of each
source layout over its targets) and exits 1 if any pair differs.
"""
import json
import os
import sys

from layout_runs import (GLOBAL_BATCH, MODELS, matrix, model_difference,
                         name_of, ranks, run_flags)

TOLERANCE = 1e-6
SAVED, RESUMED = 3, 5
TRAIN = ["--lr", "1e-3", "--lr-decay-iters", "10", "--adam-eps", "1e-6",
         "--log-interval", "1", "--eval-interval", str(RESUMED),
         "--eval-iters", "2", "--no-progress-bar"]

# pp, schedule, tp, sp, dp, distributed optimizer, recompute.
LAYOUTS = [
    (2, "1f1b", 2, True, 2, True, "selective"),
    (4, "1f1b", 1, False, 1, False, "none"),
    (2, "interleaved", 1, False, 1, False, "none"),
    (1, "-", 2, False, 2, True, "none"),
    (1, "-", 1, False, 1, False, "none"),
]


def train(trainer, bundle, data, work, name, layout, flags):
    """Trains `bundle`; returns the log file's path."""
    log = os.path.join(work, name + ".train.log")
    matrix.run([trainer, bundle] +
               (["--in-process-ranks"] if ranks(layout) > 1 else []) +
               ["--data-path", data] + TRAIN + flags, log)
    return log


def resume(trainer, bundle, data, work, name, layout, checkpoint):
    """Resumes `checkpoint` in `bundle` to iteration RESUMED: the log
    records, the saved parameters and the text log."""
    jsonl = os.path.join(work, name + ".jsonl")
    weights = os.path.join(work, name + ".st")
    log = train(trainer, bundle, data, work, name, layout,
                ["--train-iters", str(RESUMED), "--load", checkpoint,
                 "--log-jsonl", jsonl, "--save-weights", weights])
    with open(jsonl) as f:
        records = [json.loads(line) for line in f if line.strip()]
    with open(log) as f:
        text = f.read()
    return records, matrix.read_weights(weights), text


def check_model(tools, model_dir, data, work, model_name):
    compiler, trainer = tools
    bundles, checkpoints = {}, {}
    for layout in LAYOUTS:
        name = "%s-%s" % (model_name, name_of(layout))
        model, flags = run_flags(compiler, model_dir, work, model_name,
                                 MODELS[model_name], layout, name)
        bundles[layout] = os.path.join(work, name + ".mtb")
        matrix.run([compiler, model] + flags + ["-o", bundles[layout]],
                   os.path.join(work, name + ".compile.log"))
        checkpoints[layout] = os.path.join(work, name + ".ckpt")
        train(trainer, bundles[layout], data, work, name + "-save", layout,
              ["--train-iters", str(SAVED), "--save", checkpoints[layout]])

    failures = 0
    worst = {}
    for source in LAYOUTS:
        runs = {}
        # The same-layout resume first: it is the reference.
        for target in [source] + [l for l in LAYOUTS if l != source]:
            name = "%s-%s-from-%s" % (model_name, name_of(target),
                                      name_of(source))
            runs[target] = resume(trainer, bundles[target], data, work, name,
                                  target, checkpoints[source])
        reference_logs, reference_weights, _ = runs[source]
        for target in LAYOUTS:
            logs, weights, text = runs[target]
            pair = "%s %s -> %s" % (model_name, name_of(source),
                                    name_of(target))
            compared = matrix.compare_logs(reference_logs, logs)
            if compared is None or logs[0]["iteration"] != SAVED + 1:
                print("%-70s FAIL: the resumed logs do not line up" % pair)
                failures += 1
                continue
            if target != source and "resharding it for" not in text:
                print("%-70s FAIL: the resume does not say it reshards" % pair)
                failures += 1
            tensor_error, tensor = matrix.compare_weights(reference_weights,
                                                          weights)
            differences = (compared[0], compared[1],
                           model_difference(reference_weights, weights))
            ok = max(differences) <= TOLERANCE
            failures += not ok
            if target != source:
                worst[source] = [max(w, d) for w, d in
                                 zip(worst.get(source, [0.0] * 4),
                                     differences + (tensor_error,))]
            print("%-70s %s: loss %.2g, grad norm %.2g, weights %.2g (worst "
                  "tensor %.2g, %s)" % (pair, "ok" if ok else "FAIL",
                                        differences[0], differences[1],
                                        differences[2], tensor_error, tensor))
    for source in LAYOUTS:
        w = worst[source]
        print("%s from %s into the %d other layouts: loss %.2g, grad norm "
              "%.2g, weights %.2g (worst tensor %.2g)"
              % (model_name, name_of(source), len(LAYOUTS) - 1, *w))
    return failures


def main():
    args = sys.argv[1:]
    if len(args) < 5:
        sys.exit(__doc__)
    compiler, trainer, model_dir, data, work = args[:5]
    models = args[5:] or list(MODELS)
    os.makedirs(work, exist_ok=True)
    failures = count = 0
    for model_name in models:
        failures += check_model((compiler, trainer), model_dir, data, work,
                                model_name)
        count += len(LAYOUTS) ** 2
    if failures:
        sys.exit("%d of %d resumes differ from the same-layout resume"
                 % (failures, count))
    print("%d resumes (%d layouts, all pairs, %d models, global batch %d): "
          "losses, gradient norms and the saved parameters equal to the "
          "same-layout resume within %g relative"
          % (count, len(LAYOUTS), len(models), GLOBAL_BATCH, TOLERANCE))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Trains a compiled bundle through the mtrt Python module on the CPU, fed
with NumPy batches in megatron-train's sample order, and prints each
iteration's loss, gradient norm and learning rate (and writes them as JSON
lines with --log-jsonl, in megatron-train's keys).

  megatron-compile models/tiny-gpt.yaml -o tiny.mtb
  PYTHONPATH=build/python python3 examples/train_tiny.py tiny.mtb \\
      data/corpus.txt --train-iters 20 --lr 1e-3
"""
import argparse
import json
import os
import sys

import numpy as np

import mtrt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_samples import GptSamples  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("corpus")
    parser.add_argument("--train-iters", type=int, default=20)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--lr-decay-style", default="linear",
                        choices=["constant", "linear", "cosine"])
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--lr-decay-iters", type=int,
                        help="default: --train-iters, as megatron-train")
    parser.add_argument("--log-jsonl")
    parser.add_argument("--save", help="save a checkpoint here at the end "
                        "(megatron-train --load DIR resumes it)")
    args = parser.parse_args()

    bundle = mtrt.Bundle(args.bundle)
    # megatron-train's defaults: the schedule decays over --train-iters.
    session = mtrt.Session(bundle, lr=args.lr, seed=args.seed,
                           lr_decay_style=args.lr_decay_style,
                           lr_decay_iters=args.lr_decay_iters or args.train_iters,
                           threads=args.threads)
    micro_batch, seq_length = session.batch_shape
    with open(args.corpus, "rb") as f:
        samples = GptSamples(f.read(), seq_length, seed=args.seed)
    print(f"mtrt {mtrt.__version__}: training {bundle.name} "
          f"({len(session.parameter_names())} parameter tensors), "
          f"micro-batch {micro_batch} x {seq_length} tokens")

    log = open(args.log_jsonl, "w") if args.log_jsonl else None
    for iteration in range(1, args.train_iters + 1):
        first = (iteration - 1) * micro_batch
        rows = [samples[first + b] for b in range(micro_batch)]
        tokens = np.array([r[0] for r in rows], dtype=np.int32)
        labels = np.array([r[1] for r in rows], dtype=np.int32)
        session.set_batch(tokens, labels)
        m = session.train_step()
        print(f"iteration {m['iteration']:4d} | loss {m['loss']:.6f} | "
              f"grad norm {m['grad_norm']:.4f} | lr {m['learning_rate']:.3e}")
        if log:
            log.write(json.dumps({"iteration": m["iteration"], "loss": m["loss"],
                                  "grad_norm": m["grad_norm"],
                                  "lr": m["learning_rate"]}) + "\n")
    if args.save:
        session.save_checkpoint(args.save)
        print(f"saved a checkpoint of iteration {args.train_iters} to {args.save}")
    wte = np.from_dlpack(session.parameter(session.parameter_names()[0]))
    print(f"{session.parameter_names()[0]}: {wte.shape}, "
          f"mean |w| {float(np.abs(wte).mean()):.5f}")


if __name__ == "__main__":
    main()

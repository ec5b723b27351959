#!/usr/bin/env python3
"""Feeds a compiled training step on the GPU from a PyTorch DataLoader: the
samples (megatron-train's, in its order: megatron_samples.py) come out of
the DataLoader as CUDA int32 tensors and are bound to the mtrt session
through DLPack without a copy; the step, the optimizer and the parameters
stay on the GPU, and a parameter is read back as a torch tensor through
DLPack, also without a copy. Writes megatron-train's JSONL keys so that
compare_losses.py can put the two side by side.

  PYTHONPATH=<build>/python python3 examples/torch_feed.py tiny.mtb \\
      data/corpus.txt --train-iters 50 --lr 1e-3 --log-jsonl torch.jsonl
"""
import argparse
import json
import os
import sys

import torch
from torch.utils.data import DataLoader, Dataset

import mtrt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from megatron_samples import GptSamples  # noqa: E402


class MegatronSamples(Dataset):
    """megatron-train's training samples; index i is its global sample i."""

    def __init__(self, samples, count):
        self.samples, self.count = samples, count

    def __len__(self):
        return self.count

    def __getitem__(self, i):
        tokens, labels = self.samples[i]
        return (torch.tensor(tokens, dtype=torch.int32),
                torch.tensor(labels, dtype=torch.int32))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle")
    parser.add_argument("corpus")
    parser.add_argument("--train-iters", type=int, default=50)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--log-jsonl")
    args = parser.parse_args()

    bundle = mtrt.Bundle(args.bundle)
    # megatron-train's defaults: linear decay over --train-iters, no TF32.
    session = mtrt.Session(bundle, backend="cuda", device=args.device,
                           lr=args.lr, seed=args.seed, lr_decay_style="linear",
                           lr_decay_iters=args.train_iters)
    micro_batch, seq_length = session.batch_shape
    with open(args.corpus, "rb") as f:
        samples = GptSamples(f.read(), seq_length, seed=args.seed)
    dataset = MegatronSamples(samples, args.train_iters * micro_batch)
    # In order: the dataset already is megatron-train's order.
    loader = DataLoader(dataset, batch_size=micro_batch, shuffle=False,
                        pin_memory=True, num_workers=2)
    device = torch.device("cuda", args.device)
    print(f"mtrt {mtrt.__version__}, torch {torch.__version__}: training "
          f"{bundle.name} on {torch.cuda.get_device_name(device)}, micro-batch "
          f"{micro_batch} x {seq_length}")

    log = open(args.log_jsonl, "w") if args.log_jsonl else None
    for tokens, labels in loader:
        tokens = tokens.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)
        # Bound, not copied: the step reads the DataLoader's GPU tensors in
        # place; DLPack orders torch's stream before the session's.
        session.set_batch(tokens, labels, copy=False)
        m = session.train_step()
        print(f"iteration {m['iteration']:4d} | loss {m['loss']:.6f} | "
              f"grad norm {m['grad_norm']:.4f} | lr {m['learning_rate']:.3e}")
        if log:
            log.write(json.dumps({"iteration": m["iteration"], "loss": m["loss"],
                                  "grad_norm": m["grad_norm"],
                                  "lr": m["learning_rate"]}) + "\n")

    name = session.parameter_names()[0]
    weight = torch.from_dlpack(session.parameter(name))
    print(f"{name}: {tuple(weight.shape)} on {weight.device}, zero-copy view of "
          f"the session's memory; mean |w| {weight.abs().mean().item():.5f}")


if __name__ == "__main__":
    main()

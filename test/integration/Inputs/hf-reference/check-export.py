#!/usr/bin/env python3
"""Loads export-hf directories with transformers and compares their logits.

Needs torch and transformers (the GPU machine has them; a CPU is enough).

Usage: check-export.py ROOT
  ROOT holds one folder per case, each with the directory export-hf wrote
  (hf/: config.json, generation_config.json, safetensors), tokens.txt (one
  line: BATCH*SEQ token ids, BATCH given in batch.txt) and predict.txt
  (mtrt-run --function predict_step's output: `output 0: [B, S, V] f32`,
  then one value per line, V the padded vocabulary). For each case prints
  whether from_pretrained loaded every tensor (no missing, unexpected or
  mismatched keys) and the largest difference between transformers'
  float64 logits (the first vocab_size columns) and mtrt-run's, relative to
  the largest logit; exits 1 if any is above 1e-5 or a load is incomplete.
"""
import os
import re
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    print("transformers", transformers.__version__)
    ok = True
    for case in sorted(os.listdir(root)):
        folder = os.path.join(root, case)
        if not os.path.isdir(os.path.join(folder, "hf")):
            continue
        model, info = AutoModelForCausalLM.from_pretrained(
            os.path.join(folder, "hf"), dtype=torch.float32,
            attn_implementation="eager", output_loading_info=True)
        problems = {k: v for k, v in info.items() if v}
        model = model.double().eval()
        with open(os.path.join(folder, "batch.txt")) as f:
            batch = int(f.read().split()[0])
        with open(os.path.join(folder, "tokens.txt")) as f:
            ids = [int(x) for x in f.read().split()]
        tokens = torch.tensor(ids).reshape(batch, -1)
        with open(os.path.join(folder, "predict.txt")) as f:
            lines = f.read().split("\n")
        shape = [int(d) for d in re.match(r"output 0: \[([0-9, ]*)\]",
                                          lines[0]).group(1).split(",")]
        ours = torch.tensor([float(x) for x in lines[1:1 + shape[0] * shape[1]
                                                     * shape[2]]],
                            dtype=torch.float64).reshape(shape)
        with torch.no_grad():
            theirs = model(input_ids=tokens).logits.double()
        vocab = theirs.shape[-1]
        ours = ours[..., :vocab]
        difference = ((ours - theirs).abs().max() / theirs.abs().max()).item()
        good = difference <= 1e-5 and not problems
        ok &= good
        print("%s: %s, loading %s, logits %s: max relative difference %.2e %s 1e-5"
              % (case, type(model).__name__,
                 "complete" if not problems else "INCOMPLETE %s" % problems,
                 list(theirs.shape), difference, "<=" if difference <= 1e-5 else ">"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

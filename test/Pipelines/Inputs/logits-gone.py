"""Reads two `megatron-compile --report memory` outputs of one model, without
and with --fuse-linear-cross-entropy, and checks that what the output layer
keeps for the backward pass, and the train_step arena's peak, fall by at
least the whole-vocabulary logits less what the fused op keeps instead
(report-memory-linear-cross-entropy.test).

Usage: logits-gone.py BEFORE AFTER TOKENS VOCAB HIDDEN LOGIT_BYTES
"""
import re
import sys


def figures(path):
    text = open(path).read()
    peak = int(re.search(r"activations \(train_step arena peak\)\s+(\d+)",
                         text).group(1))
    output = int(re.search(r"embeddings and output layer\s+(\d+)",
                           text).group(1))
    return peak, output


before, after = figures(sys.argv[1]), figures(sys.argv[2])
tokens, vocab, hidden, logit_bytes = map(int, sys.argv[3:7])
# The fused op keeps dx [tokens, hidden] in the logits' type (its input's)
# and dW [vocab, hidden] in f32.
least = tokens * vocab * logit_bytes - (logit_bytes * tokens + 4 * vocab) * hidden
for name, old, new in (("peak", before[0], after[0]),
                       ("output layer", before[1], after[1])):
    if old - new < least:
        sys.exit(f"{name}: {old} -> {new} bytes, falls by {old - new}, less "
                 f"than the logits less dx and dW ({least})")
print(f"output layer {before[1] / 2**30:.2f} GiB -> {after[1] / 2**20:.2f} MiB; "
      f"peak falls by more than {least} bytes")

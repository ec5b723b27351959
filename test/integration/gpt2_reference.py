#!/usr/bin/env python3
"""An independent float64 reference for a small GPT-2, in pure Python.

Writes seeded random weights named as Hugging Face's GPT2LMHeadModel to a
safetensors file (encoded here byte by byte), token and label files for
mtrt-run --inputs, and prints the mean cross-entropy loss of GPT-2's forward
pass and the logits of one position, each with 17 significant digits.

The forward pass follows Hugging Face's modeling_gpt2.py, written out
directly: token plus learned position embeddings; per layer a pre-LayerNorm
causal self-attention (Conv1D c_attn giving q, k, v side by side, heads as
consecutive slices of each, scores scaled by 1/sqrt(head_dim)) and a
pre-LayerNorm MLP with gelu_new, each added to the residual stream; a final
LayerNorm; logits against the tied word embeddings. Dropout is off.

Usage: gpt2_reference.py PREFIX
  writes PREFIX.safetensors, PREFIX.inputs (tokens line, labels line) and
  PREFIX.tokens (tokens line), and prints
    loss <value>
    logits <batch> <position> <V values>
"""
import json
import math
import random
import struct
import sys

# Must match Inputs/gpt2-reference.yaml.
LAYERS = 2
HIDDEN = 16
HEADS = 2
FFN = 64
SEQ = 8
VOCAB = 32
BATCH = 2
EPS = 1e-5
SEED = 20240601
# The position whose logits are printed.
LOGITS_AT = (1, 5)


def f32(x):
    """x rounded to float32, as a tensor stored as F32 is read."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


class Tensor:
    def __init__(self, shape, values, dtype):
        self.shape = shape
        self.values = values  # flat, row-major
        self.dtype = dtype

    def rows(self):
        cols = self.shape[-1]
        return [self.values[i * cols:(i + 1) * cols]
                for i in range(len(self.values) // cols)]


def make_weights(rng):
    def normal(shape, std, mean=0.0, dtype="F64"):
        n = 1
        for d in shape:
            n *= d
        values = [mean + rng.gauss(0.0, std) for _ in range(n)]
        if dtype == "F32":
            values = [f32(v) for v in values]
        return Tensor(shape, values, dtype)

    w = {}
    w["transformer.wte.weight"] = normal([VOCAB, HIDDEN], 0.5)
    # Stored as F32 to exercise the conversion; the reference uses the
    # rounded values.
    w["transformer.wpe.weight"] = normal([SEQ, HIDDEN], 0.3, dtype="F32")
    for i in range(LAYERS):
        p = "transformer.h.%d." % i
        w[p + "ln_1.weight"] = normal([HIDDEN], 0.1, mean=1.0)
        w[p + "ln_1.bias"] = normal([HIDDEN], 0.1)
        w[p + "attn.c_attn.weight"] = normal([HIDDEN, 3 * HIDDEN], 0.4)
        w[p + "attn.c_attn.bias"] = normal([3 * HIDDEN], 0.1)
        w[p + "attn.c_proj.weight"] = normal([HIDDEN, HIDDEN], 0.3)
        w[p + "attn.c_proj.bias"] = normal([HIDDEN], 0.1)
        w[p + "ln_2.weight"] = normal([HIDDEN], 0.1, mean=1.0)
        w[p + "ln_2.bias"] = normal([HIDDEN], 0.1)
        w[p + "mlp.c_fc.weight"] = normal([HIDDEN, FFN], 0.3)
        w[p + "mlp.c_fc.bias"] = normal([FFN], 0.1)
        w[p + "mlp.c_proj.weight"] = normal([FFN, HIDDEN], 0.2)
        w[p + "mlp.c_proj.bias"] = normal([HIDDEN], 0.1)
    w["transformer.ln_f.weight"] = normal([HIDDEN], 0.1, mean=1.0)
    w["transformer.ln_f.bias"] = normal([HIDDEN], 0.1)
    return w


def write_safetensors(path, weights):
    """The format: an 8-byte little-endian header length, the JSON header
    (padded with spaces to a multiple of 8), then the tensors' bytes."""
    tensors = dict(weights)
    # What GPT2LMHeadModel's state_dict also holds: the tied output layer
    # (loaders accept it when it equals the embedding) and each layer's
    # causal-mask buffer (ignored).
    tensors["lm_head.weight"] = weights["transformer.wte.weight"]
    for i in range(LAYERS):
        mask = [1.0 if c <= r else 0.0 for r in range(SEQ) for c in range(SEQ)]
        tensors["transformer.h.%d.attn.bias" % i] = Tensor(
            [1, 1, SEQ, SEQ], mask, "F32")
    header = {"__metadata__": {"format": "pt"}}
    data = bytearray()
    for name in sorted(tensors):
        t = tensors[name]
        code = {"F64": "<d", "F32": "<f"}[t.dtype]
        begin = len(data)
        for v in t.values:
            data += struct.pack(code, v)
        header[name] = {"dtype": t.dtype, "shape": t.shape,
                        "data_offsets": [begin, len(data)]}
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        f.write(bytes(data))


def layer_norm(x, weight, bias):
    mean = sum(x) / len(x)
    var = sum((v - mean) ** 2 for v in x) / len(x)
    inv = 1.0 / math.sqrt(var + EPS)
    return [(v - mean) * inv * g + b for v, g, b in zip(x, weight, bias)]


def conv1d(x, weight, bias):
    """Hugging Face's Conv1D: x @ W + b with W stored [in, out]."""
    rows = weight.rows()
    out = list(bias.values)
    for i, xi in enumerate(x):
        row = rows[i]
        for j in range(len(out)):
            out[j] += xi * row[j]
    return out


def gelu_new(x):
    return 0.5 * x * (1.0 + math.tanh(
        math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def forward(w, tokens):
    """Logits [SEQ][VOCAB] of one sequence."""
    wte = w["transformer.wte.weight"].rows()
    wpe = w["transformer.wpe.weight"].rows()
    h = [[a + b for a, b in zip(wte[t], wpe[s])] for s, t in enumerate(tokens)]
    d = HIDDEN // HEADS
    for i in range(LAYERS):
        p = "transformer.h.%d." % i
        a = [layer_norm(x, w[p + "ln_1.weight"].values,
                        w[p + "ln_1.bias"].values) for x in h]
        qkv = [conv1d(x, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"])
               for x in a]
        q = [r[:HIDDEN] for r in qkv]
        k = [r[HIDDEN:2 * HIDDEN] for r in qkv]
        v = [r[2 * HIDDEN:] for r in qkv]
        attended = [[0.0] * HIDDEN for _ in range(SEQ)]
        for head in range(HEADS):
            lo, hi = head * d, (head + 1) * d
            for s in range(SEQ):
                scores = [sum(qa * kb for qa, kb in zip(q[s][lo:hi], k[j][lo:hi]))
                          / math.sqrt(d) for j in range(s + 1)]
                top = max(scores)
                e = [math.exp(x - top) for x in scores]
                total = sum(e)
                for j in range(s + 1):
                    pj = e[j] / total
                    for c in range(lo, hi):
                        attended[s][c] += pj * v[j][c]
        h = [[x + y for x, y in zip(hs, conv1d(o, w[p + "attn.c_proj.weight"],
                                               w[p + "attn.c_proj.bias"]))]
             for hs, o in zip(h, attended)]
        m = [layer_norm(x, w[p + "ln_2.weight"].values,
                        w[p + "ln_2.bias"].values) for x in h]
        f = [[gelu_new(y) for y in conv1d(x, w[p + "mlp.c_fc.weight"],
                                          w[p + "mlp.c_fc.bias"])] for x in m]
        h = [[x + y for x, y in zip(hs, conv1d(fs, w[p + "mlp.c_proj.weight"],
                                               w[p + "mlp.c_proj.bias"]))]
             for hs, fs in zip(h, f)]
    final = [layer_norm(x, w["transformer.ln_f.weight"].values,
                        w["transformer.ln_f.bias"].values) for x in h]
    return [[sum(a * b for a, b in zip(x, wte[t])) for t in range(VOCAB)]
            for x in final]


def cross_entropy(logits, label):
    top = max(logits)
    return top + math.log(sum(math.exp(x - top) for x in logits)) - logits[label]


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    prefix = sys.argv[1]
    rng = random.Random(SEED)
    weights = make_weights(rng)
    tokens = [[rng.randrange(VOCAB) for _ in range(SEQ)] for _ in range(BATCH)]
    labels = [[rng.randrange(VOCAB) for _ in range(SEQ)] for _ in range(BATCH)]
    write_safetensors(prefix + ".safetensors", weights)
    flat = lambda rows: " ".join(str(x) for r in rows for x in r) + "\n"
    with open(prefix + ".inputs", "w") as f:
        f.write(flat(tokens) + flat(labels))
    with open(prefix + ".tokens", "w") as f:
        f.write(flat(tokens))

    logits = [forward(weights, seq) for seq in tokens]
    losses = [cross_entropy(logits[b][s], labels[b][s])
              for b in range(BATCH) for s in range(SEQ)]
    print("loss %.17g" % (sum(losses) / len(losses)))
    b, s = LOGITS_AT
    print("logits %d %d %s" % (b, s, " ".join("%.17g" % x for x in logits[b][s])))


if __name__ == "__main__":
    main()

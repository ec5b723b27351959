#!/usr/bin/env python3
"""Makes the Hugging Face reference models of hf-reference-loss.test.

Needs torch and transformers (the GPU machine has them; a CPU is enough).
For each tiny model below: builds it with transformers from a config, draws
seeded weights large enough that the loss depends on every tensor, saves it
with save_pretrained (config.json, generation_config.json, model.safetensors,
all in float32), draws a fixed batch of tokens and computes transformers'
mean cross-entropy loss on it in float64 (eager attention) and in float32.

Usage: make-hf-reference.py OUT
  writes <name>/{config.json, generation_config.json, model.safetensors,
  batch.txt, reference.txt} for each model into OUT/hf-reference.tar.gz
  (one file: the device tool returns few).
  batch.txt is mtrt-run's --inputs form: a tokens line and a labels line
  (the next tokens), BATCH x SEQ each. reference.txt holds
    loss-f64 <value>
    loss-f32 <value>
    transformers <version>
    inv_freq <values...> / attention_scaling <value> of the first layer's
  rotary embedding, to diagnose a mismatch.
"""
import json
import math
import os
import sys
import tarfile
import tempfile

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

SEED = 20261202
BATCH = 2
SEQ = 16
VOCAB = 128

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_act="silu",
    rms_norm_eps=1e-5,
    initializer_range=0.02,
    attention_dropout=0.0,
    bos_token_id=1,
    eos_token_id=2,
)

# name -> (model_type, fields)
MODELS = {
    # Llama 3.1's scaling at a tiny size: with head_dim 16 and base 500000 the
    # wavelengths span kept, blended and divided pairs.
    "llama31": ("llama", dict(
        COMMON, max_position_embeddings=128, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0,
                             factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0,
                             original_max_position_embeddings=8192))),
    # Qwen2: biases on q, k and v only; tied embeddings.
    "qwen2": ("qwen2", dict(
        COMMON, max_position_embeddings=128, tie_word_embeddings=True,
        use_sliding_window=False,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
    # Qwen3: per-head q/k RMSNorm and a head_dim (32) that is not
    # hidden_size / num_attention_heads (16).
    "qwen3": ("qwen3", dict(
        COMMON, max_position_embeddings=128, tie_word_embeddings=False,
        head_dim=32, attention_bias=False, use_sliding_window=False,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # YaRN on Llama: beta_fast 4 and beta_slow 0.5 put the ramp inside the
    # 8 rotated pairs; factor equals max_position_embeddings /
    # original_max_position_embeddings, so every transformers version reads
    # the same factor. attention_factor is left to its default.
    "llama-yarn": ("llama", dict(
        COMMON, max_position_embeddings=256, tie_word_embeddings=False,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=64,
                             beta_fast=4.0, beta_slow=0.5))),
}


def make_config(model_type, fields):
    try:
        return AutoConfig.for_model(model_type, **fields)
    except TypeError:
        # transformers 4: rope_theta at the top, rope_scaling beside it.
        fields = dict(fields)
        rope = dict(fields.pop("rope_parameters"))
        fields["rope_theta"] = rope.pop("rope_theta")
        fields["rope_scaling"] = None if rope["rope_type"] == "default" else rope
        return AutoConfig.for_model(model_type, **fields)


def draw_weights(model, generator):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
            elif name.endswith(".bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=generator))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=generator) /
                        math.sqrt(fan_in))


def loss_of(model, tokens, labels, dtype):
    m = model.to(dtype)
    with torch.no_grad():
        logits = m(input_ids=tokens).logits.to(dtype)
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels.reshape(-1)).item()


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    work = tempfile.mkdtemp()
    names = []
    for index, (name, (model_type, fields)) in enumerate(MODELS.items()):
        directory = os.path.join(work, name)
        os.makedirs(directory, exist_ok=True)
        config = make_config(model_type, fields)
        config._attn_implementation = "eager"
        torch.manual_seed(SEED + index)
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation="eager", torch_dtype=torch.float32)
        generator = torch.Generator().manual_seed(SEED + index)
        draw_weights(model, generator)
        model.eval()
        model.save_pretrained(directory, safe_serialization=True)

        rows = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator)
        tokens, labels = rows[:, :-1], rows[:, 1:]
        flat = lambda t: " ".join(str(int(x)) for x in t.reshape(-1)) + "\n"
        with open(os.path.join(directory, "batch.txt"), "w") as f:
            f.write(flat(tokens) + flat(labels))

        loss32 = loss_of(model, tokens, labels, torch.float32)
        loss64 = loss_of(model, tokens, labels, torch.float64)
        rotary = model.model.rotary_emb
        with open(os.path.join(directory, "reference.txt"), "w") as f:
            f.write("loss-f64 %.17g\n" % loss64)
            f.write("loss-f32 %.9g\n" % loss32)
            f.write("transformers %s\n" % transformers.__version__)
            f.write("inv_freq %s\n" % " ".join(
                "%.9g" % x for x in rotary.inv_freq.double().tolist()))
            f.write("attention_scaling %.17g\n" %
                    float(getattr(rotary, "attention_scaling", 1.0)))
        print(name, "loss-f64 %.17g loss-f32 %.9g" % (loss64, loss32))
        names.append(name)
    with tarfile.open(os.path.join(out, "hf-reference.tar.gz"), "w:gz") as tar:
        for name in names:
            tar.add(os.path.join(work, name), arcname=name)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Makes the Hugging Face MoE references of hf-mixtral-step.test.

Needs torch and transformers (the GPU machine has them; a CPU is enough).
For each tiny model below (Mixtral; Qwen3-MoE for the next step of issue
25): builds it with transformers from a config, draws seeded float32
weights, then in float64 (eager attention, router aux loss off:
output_router_logits False) computes the mean cross-entropy loss of one
fixed sample, its gradients, and one torch.optim.AdamW step:

  lr 1e-3, betas (0.9, 0.95), eps 1e-8, weight decay 0.01 on every tensor
  of two or more dimensions (embeddings, projections, router, experts) and
  0 on the norms (Megatron-LM's rule: no decay on biases and norms), no
  gradient clipping, one step (bias-corrected moments).

These are megatron-train's defaults with --lr 1e-3 --clip-grad 0
--lr-decay-style constant.

The sample: SEQ printable bytes p; the corpus written beside it (corpus.txt)
is p repeated, so every sample megatron-train draws from it with a
ByteTokenizer and sequence length SEQ is tokens p[0..SEQ), labels
p[1..SEQ) + p[0], whatever the shuffle.

Usage: make-hf-moe-reference.py OUT
  writes OUT/hf-moe-reference.tar.gz with, per model, <name>/
    config.json          as save_pretrained writes it
    model.safetensors    the initial weights in the hub's on-disk names
                         (Mixtral: block_sparse_moe.gate,
                         block_sparse_moe.experts.N.w1/w2/w3; Qwen3-MoE:
                         mlp.gate, mlp.experts.N.gate_proj/up_proj/
                         down_proj), float32, whatever layout this
                         transformers version holds in memory
    after-step.safetensors  the weights after the AdamW step (float32 of
                         the float64 result), the same names
    corpus.txt, batch.txt   the corpus; the sample's tokens and labels
    reference.txt        loss-f64, loss-f32, the AdamW settings,
                         transformers' version
"""
import json
import math
import os
import struct
import sys
import tarfile
import tempfile

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

SEED = 20261203
SEQ = 32
VOCAB = 128
LR, BETAS, EPS, WEIGHT_DECAY = 1e-3, (0.9, 0.95), 1e-8, 0.01

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    hidden_act="silu",
    rms_norm_eps=1e-5,
    initializer_range=0.02,
    attention_dropout=0.0,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)

MODELS = {
    # Mixtral: 4 experts, top-2 (the softmax over the chosen logits),
    # no shared expert, no biases.
    "mixtral": ("mixtral", dict(
        COMMON, intermediate_size=48, num_local_experts=4,
        num_experts_per_tok=2, output_router_logits=False,
        router_aux_loss_coef=0.0, router_jitter_noise=0.0,
        sliding_window=None,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # Qwen3-MoE: per-head q/k norms, head_dim 16, normalized top-k.
    "qwen3-moe": ("qwen3_moe", dict(
        COMMON, intermediate_size=64, moe_intermediate_size=48,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], head_dim=16,
        output_router_logits=False, router_aux_loss_coef=0.0,
        attention_bias=False, use_sliding_window=False,
        rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
}


def make_config(model_type, fields):
    try:
        return AutoConfig.for_model(model_type, **fields)
    except TypeError:
        fields = dict(fields)
        rope = dict(fields.pop("rope_parameters"))
        fields["rope_theta"] = rope.pop("rope_theta")
        fields["rope_scaling"] = None
        return AutoConfig.for_model(model_type, **fields)


def draw_weights(model, generator):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=generator))
            elif "embed_tokens" in name:
                p.copy_(0.5 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(torch.randn(p.shape, generator=generator) /
                        math.sqrt(p.shape[-1]))


def hub_tensors(model, model_type, config):
    """The state dict in the hub's on-disk names, per-expert tensors, from
    whichever layout transformers holds (per-expert modules in 4.x, fused
    gate_up_proj [E, 2I, H] and down_proj [E, H, I] in 5.x)."""
    block = "block_sparse_moe" if model_type == "mixtral" else "mlp"
    names = ("w1", "w3", "w2") if model_type == "mixtral" else (
        "gate_proj", "up_proj", "down_proj")
    ffn = config.intermediate_size if model_type == "mixtral" else \
        config.moe_intermediate_size
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach()
        prefix, _, leaf = name.rpartition(".experts.")
        if not prefix:
            if ".mlp.gate." in name or ".block_sparse_moe.gate." in name:
                name = name.replace(".mlp.gate.", "." + block + ".gate.")
                name = name.replace(".block_sparse_moe.gate.",
                                    "." + block + ".gate.")
            out[name] = t
            continue
        layer = prefix.rsplit(".", 1)[0] + "." + block + ".experts."
        if leaf == "gate_up_proj":
            experts, rows, cols = t.shape
            if rows == 2 * ffn and cols == config.hidden_size:
                gate, up = t[:, :ffn, :], t[:, ffn:, :]
            elif cols == 2 * ffn and rows == config.hidden_size:
                gate = t[:, :, :ffn].transpose(1, 2)
                up = t[:, :, ffn:].transpose(1, 2)
            else:
                raise SystemExit("unexpected gate_up_proj shape %s" % (t.shape,))
            for e in range(experts):
                out[layer + "%d.%s.weight" % (e, names[0])] = gate[e]
                out[layer + "%d.%s.weight" % (e, names[1])] = up[e]
        elif leaf == "down_proj":
            if t.shape[1] != config.hidden_size:
                t = t.transpose(1, 2)
            for e in range(t.shape[0]):
                out[layer + "%d.%s.weight" % (e, names[2])] = t[e]
        elif leaf.split(".")[0].isdigit():
            # 4.x: experts.N.w1.weight (or gate_proj...) already per expert.
            out[layer + leaf] = t
        else:
            raise SystemExit("unexpected expert tensor %s %s" % (name, t.shape))
    return {k: v.contiguous() for k, v in out.items()}


def check_moe_block(model, model_type, config, tensors, generator):
    """The hub-named tensors reproduce layer 0's MoE block in float64."""
    layer = model.model.layers[0]
    block = getattr(layer, "block_sparse_moe", None) or layer.mlp
    x = torch.randn(7, config.hidden_size, generator=generator,
                    dtype=torch.float64)
    with torch.no_grad():
        got = block(x.unsqueeze(0))
        got = (got[0] if isinstance(got, tuple) else got).reshape(7, -1)
    pre = "model.layers.0." + ("block_sparse_moe" if model_type == "mixtral"
                               else "mlp") + "."
    names = ("w1", "w3", "w2") if model_type == "mixtral" else (
        "gate_proj", "up_proj", "down_proj")
    logits = x @ tensors[pre + "gate.weight"].double().T
    probs = torch.softmax(logits, dim=-1)
    top, idx = torch.topk(probs, config.num_experts_per_tok, dim=-1)
    top = top / top.sum(-1, keepdim=True)
    want = torch.zeros_like(x)
    for t in range(7):
        for k in range(config.num_experts_per_tok):
            e = int(idx[t, k])
            w = lambda n: tensors[pre + "experts.%d.%s.weight" % (e, n)].double()
            h = torch.nn.functional.silu(w(names[0]) @ x[t]) * (w(names[1]) @ x[t])
            want[t] += top[t, k] * (w(names[2]) @ h)
    err = (got - want).abs().max().item()
    # transformers takes the router's softmax in float32 (dtype=torch.float)
    # even in a float64 model, so the block agrees to float32's rounding.
    if err > 1e-6:
        raise SystemExit("%s: hub-named experts differ from the block by %g"
                         % (model_type, err))
    return err


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = tensors[name].to(torch.float32).contiguous().numpy().tobytes()
        header[name] = dict(dtype="F32", shape=list(tensors[name].shape),
                            data_offsets=[offset, offset + len(data)])
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


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
        torch.manual_seed(SEED + index)
        try:
            # transformers 5 runs the experts through torch._grouped_mm,
            # which has no float64: ask for the eager loop over experts.
            model = AutoModelForCausalLM.from_config(
                config, attn_implementation="eager", dtype=torch.float32,
                experts_implementation="eager")
        except (TypeError, ValueError):
            model = AutoModelForCausalLM.from_config(
                config, attn_implementation="eager", dtype=torch.float32)
        if hasattr(model, "set_experts_implementation"):
            model.set_experts_implementation("eager")
        for c in {id(m.config): m.config for m in model.modules()
                  if hasattr(m, "config")}.values():
            if hasattr(c, "_experts_implementation"):
                c._experts_implementation = "eager"
        generator = torch.Generator().manual_seed(SEED + index)
        draw_weights(model, generator)
        model.config.save_pretrained(directory)
        write_safetensors(os.path.join(directory, "model.safetensors"),
                          hub_tensors(model, model_type, config))

        pattern = torch.randint(32, 127, (SEQ,), generator=generator)
        with open(os.path.join(directory, "corpus.txt"), "wb") as f:
            f.write(bytes(int(b) for b in pattern.tolist()) * 8)
        tokens = pattern.unsqueeze(0)
        labels = torch.roll(pattern, -1).unsqueeze(0)
        flat = lambda t: " ".join(str(int(x)) for x in t.reshape(-1)) + "\n"
        with open(os.path.join(directory, "batch.txt"), "w") as f:
            f.write(flat(tokens) + flat(labels))

        def loss_of(m):
            logits = m(input_ids=tokens).logits
            return torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))

        with torch.no_grad():
            loss32 = loss_of(model).item()
        model = model.to(torch.float64)
        model.train()
        err = check_moe_block(model, model_type, config,
                              hub_tensors(model, model_type, config),
                              generator)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [dict(params=decay, weight_decay=WEIGHT_DECAY),
             dict(params=no_decay, weight_decay=0.0)],
            lr=LR, betas=BETAS, eps=EPS, foreach=False)
        optimizer.zero_grad()
        loss = loss_of(model)
        loss.backward()
        optimizer.step()
        loss64 = loss.item()
        write_safetensors(os.path.join(directory, "after-step.safetensors"),
                          hub_tensors(model, model_type, config))
        with open(os.path.join(directory, "reference.txt"), "w") as f:
            f.write("loss-f64 %.17g\n" % loss64)
            f.write("loss-f32 %.9g\n" % loss32)
            f.write("adamw lr %g beta1 %g beta2 %g eps %g weight-decay %g "
                    "(not on norms) clip none\n" % (LR, BETAS[0], BETAS[1],
                                                    EPS, WEIGHT_DECAY))
            f.write("transformers %s torch %s\n" % (transformers.__version__,
                                                   torch.__version__))
            f.write("in-memory names %s\n" % " ".join(
                sorted({n.split(".experts.")[-1] for n in
                        model.state_dict() if ".experts." in n})))
        print(name, "loss-f64 %.17g loss-f32 %.9g block-check %.3g"
              % (loss64, loss32, err))
        names.append(name)
    with tarfile.open(os.path.join(out, "hf-moe-reference.tar.gz"),
                      "w:gz") as tar:
        for name in names:
            tar.add(os.path.join(work, name), arcname=name)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""PyTorch at its best, the baseline megatron-train is measured against: one
training step of a model file's model (models/*.yaml) on one GPU.

- GPT (models/gpt2-124m.yaml, gpt2-350m.yaml, gpt-1.3b.yaml): learned
  positions, LayerNorm, biases, tanh GeLU, tied embeddings, the vocabulary
  padded as the bundle pads it.
- Llama (position_embedding_type rope, e.g. models/llama-1.5b.yaml), lean:
  RMSNorm, RoPE, grouped-query attention through SDPA, SwiGLU, no biases,
  untied output layer.

- Llama with --llama hf: Hugging Face's LlamaForCausalLM at the same shape
  (transformers, attention through SDPA, its own RoPE, separate q/k/v and
  gate/up GEMMs, keys and values repeated for grouped-query attention):
  what most PyTorch users run, the second ratio of issue 22. It has no
  hidden dropout (only LlamaConfig's attention_dropout, which --dropout
  sets).

Lean models: QKV and (for SwiGLU) gate/up as one GEMM each, bf16 autocast over fp32
master weights (Megatron-LM's default), torch.compile (by default each
block and the final norm + output layer + loss compiled apart, as torchtitan
does: --compile model makes the whole model one graph, at several times the
compile time), AdamW with fused=True (betas 0.9/0.95, weight decay 0.1 on
matrices), TF32 for what stays in fp32. Dropout (--dropout, hidden and
attention alike) replaces the model file's. Gradients are clipped to a
global norm of --clip-grad (default 1.0, megatron-train's and Megatron-LM's
default; 0: no clipping) by clip_grad_norm_ with foreach kernels, as
nanoGPT and torchtitan do, so that both sides train the same way
(bench/run-step-table.sh passes one value to both).

Attention: --sdpa best (the default) times SDPA's forward and backward at
the model's shape for every backend that takes it (cuDNN, FlashAttention-2,
memory-efficient; for grouped-query attention with the key/value heads
repeated and, where the backend takes it, enable_gqa) and compiles the model
with the fastest; the JSON line names it and lists the times.

Timing: --warmup steps (the compile included), then --steps steps, each
between two CUDA events; the median is the step time. Memory: the peaks of
the whole run, torch.cuda.max_memory_reserved (the caching allocator's
segments, what the process holds on the device) and max_memory_allocated.
MFU as modelfile.py (DESIGN.md) defines it. --profile STEPS: after the
timed steps, each kernel's device time a step over STEPS steps under
torch.profiler, on stderr (beside megatron-train's MTRT_CUDA_PROFILE=1).

  python3 bench/torch_step.py models/gpt2-124m.yaml --micro-batch-size 32 \\
      --dropout 0 0.1
  python3 bench/torch_step.py models/llama-1.5b.yaml --dropout 0

One JSON line per dropout value, on stdout.
"""
import argparse
import gc
import json
import os
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modelfile  # noqa: E402

BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION,
            "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION}


def use_backend(name):
    """Enables SDPA's backend NAME alone, globally: torch.compile reads these
    flags when it traces the attention, so the choice holds in the graph."""
    torch.backends.cuda.enable_cudnn_sdp(name == "cudnn")
    torch.backends.cuda.enable_flash_sdp(name == "flash")
    torch.backends.cuda.enable_mem_efficient_sdp(name == "efficient")
    torch.backends.cuda.enable_math_sdp(False)


def attention(q, k, v, dropout, native_gqa):
    """Causal SDPA over (b, heads, s, d) queries and (b, groups, s, d) keys and
    values; grouped-query heads by enable_gqa or by repeating keys/values."""
    groups = q.shape[1] // k.shape[1]
    if groups > 1 and not native_gqa:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    extra = {"enable_gqa": True} if groups > 1 and native_gqa else {}
    return F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                          dropout_p=dropout, **extra)


class GptBlock(nn.Module):
    def __init__(self, m, dropout):
        super().__init__()
        h = m["hidden_size"]
        self.heads, self.dropout = m["num_attention_heads"], dropout
        self.ln1 = nn.LayerNorm(h, eps=m["norm_epsilon"])
        self.qkv = nn.Linear(h, 3 * h)
        self.proj = nn.Linear(h, h)
        self.ln2 = nn.LayerNorm(h, eps=m["norm_epsilon"])
        self.fc = nn.Linear(h, m["ffn_hidden_size"])
        self.out = nn.Linear(m["ffn_hidden_size"], h)

    def forward(self, x, rope):
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, -1).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(h, dim=2))
        p = self.dropout if self.training else 0.0
        y = attention(q, k, v, p, False).transpose(1, 2).reshape(b, s, h)
        x = x + drop(self.proj(y), p, self.training)
        y = self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x + drop(y, p, self.training)


def allow_recompiles(blocks):
    """Raises dynamo's recompile limit to twice `blocks`: one graph serves
    every block, and the limit only guards against a recompile per block
    falling back to eager unnoticed."""
    config = torch._dynamo.config
    key = ("recompile_limit" if hasattr(config, "recompile_limit")
           else "cache_size_limit")
    setattr(config, key, max(getattr(config, key), 2 * blocks))


def drop(x, p, training):
    """Dropout, left out of the graph entirely when it would keep all."""
    return F.dropout(x, p, True) if training and p > 0 else x


def rotate(x, cos, sin):
    """RoPE on (b, s, heads, d), rotating the two halves of each head."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, m, dropout, native_gqa):
        super().__init__()
        h, d = m["hidden_size"], m["head_dim"]
        self.heads, self.groups = m["num_attention_heads"], m["num_query_groups"]
        self.dropout, self.native_gqa = dropout, native_gqa
        self.split = [self.heads * d, self.groups * d, self.groups * d]
        self.norm1 = nn.RMSNorm(h, eps=m["norm_epsilon"])
        self.qkv = nn.Linear(h, sum(self.split), bias=False)
        self.o = nn.Linear(self.heads * d, h, bias=False)
        self.norm2 = nn.RMSNorm(h, eps=m["norm_epsilon"])
        self.gate_up = nn.Linear(h, 2 * m["ffn_hidden_size"], bias=False)
        self.down = nn.Linear(m["ffn_hidden_size"], h, bias=False)

    def forward(self, x, rope):
        b, s, h = x.shape
        cos, sin = rope
        q, k, v = self.qkv(self.norm1(x)).split(self.split, dim=2)
        q = rotate(q.view(b, s, self.heads, -1), cos, sin).to(v.dtype)
        k = rotate(k.view(b, s, self.groups, -1), cos, sin).to(v.dtype)
        v = v.view(b, s, self.groups, -1)
        p = self.dropout if self.training else 0.0
        y = attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                      p, self.native_gqa)
        x = x + drop(self.o(y.transpose(1, 2).reshape(b, s, -1)), p,
                     self.training)
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + drop(self.down(F.silu(gate) * up), p, self.training)


class Model(nn.Module):
    """The model and its loss: tokens (b, s + 1) in, mean cross-entropy out."""

    def __init__(self, m, dropout, native_gqa):
        super().__init__()
        h, v, s = m["hidden_size"], m["padded_vocab"], m["seq_length"]
        self.llama, self.dropout = m["llama"], dropout
        self.embed = nn.Embedding(v, h)
        if self.llama:
            self.blocks = nn.ModuleList(LlamaBlock(m, dropout, native_gqa)
                                        for _ in range(m["num_layers"]))
            self.norm = nn.RMSNorm(h, eps=m["norm_epsilon"])
            self.head = nn.Linear(h, v, bias=False)
            d = m["head_dim"]
            inv = m["rotary_base"] ** (-torch.arange(0, d, 2).float() / d)
            angles = torch.outer(torch.arange(s).float(), inv)
            angles = torch.cat((angles, angles), dim=-1)[None, :, None, :]
            self.register_buffer("cos", angles.cos(), persistent=False)
            self.register_buffer("sin", angles.sin(), persistent=False)
        else:
            self.positions = nn.Embedding(s, h)
            self.blocks = nn.ModuleList(GptBlock(m, dropout)
                                        for _ in range(m["num_layers"]))
            self.norm = nn.LayerNorm(h, eps=m["norm_epsilon"])
            self.head = None  # tied: the output layer is self.embed
        std = m["init_method_std"]
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens):
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        x = self.embed(inputs)
        rope = None
        if self.llama:
            rope = (self.cos, self.sin)
        else:
            x = x + self.positions.weight[:inputs.shape[1]]
        x = drop(x, self.dropout, self.training)
        for block in self.blocks:
            x = block(x, rope)
        return self.loss(x, labels)

    def loss(self, x, labels):
        x = self.norm(x)
        logits = self.head(x) if self.llama else x @ self.embed.weight.t()
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    def compile_regions(self):
        """torchtitan's way: each block compiled on its own (identical blocks
        share one graph, so compiling takes a layer's time, not the
        model's), and the final norm, output layer and loss as one more."""
        allow_recompiles(len(self.blocks))
        for block in self.blocks:
            block.compile()
        self.loss = torch.compile(self.loss)


class HfLlama(nn.Module):
    """Hugging Face's LlamaForCausalLM at the model file's shape, with the
    lean Model's interface: tokens (b, s + 1) in, mean cross-entropy out."""

    def __init__(self, m, dropout):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM
        config = LlamaConfig(
            vocab_size=m["padded_vocab"], hidden_size=m["hidden_size"],
            intermediate_size=m["ffn_hidden_size"],
            num_hidden_layers=m["num_layers"],
            num_attention_heads=m["num_attention_heads"],
            num_key_value_heads=m["num_query_groups"],
            head_dim=m["head_dim"], max_position_embeddings=m["seq_length"],
            rms_norm_eps=m["norm_epsilon"], rope_theta=m["rotary_base"],
            attention_dropout=dropout, tie_word_embeddings=False,
            initializer_range=m["init_method_std"], use_cache=False,
            attn_implementation="sdpa")
        # Newer transformers keep the base in rope_parameters.
        rope = getattr(config, "rope_parameters", None)
        if isinstance(rope, dict):
            rope["rope_theta"] = m["rotary_base"]
        self.model = LlamaForCausalLM(config)

    def forward(self, tokens):
        inputs, labels = tokens[:, :-1], tokens[:, 1:]
        logits = self.model(input_ids=inputs, use_cache=False).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())

    def compile_regions(self):
        """Each decoder layer compiled on its own, as Model's blocks."""
        layers = self.model.model.layers
        allow_recompiles(len(layers))
        for layer in layers:
            layer.compile()


def time_attention(m, b, dropout, iters=10):
    """Milliseconds of SDPA forward + backward at the model's shape, per
    usable (backend, enable_gqa) choice; a choice that fails is left out."""
    heads, groups, d = (m["num_attention_heads"], m["num_query_groups"],
                        m["head_dim"])
    s = m["seq_length"]
    q = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    k = torch.randn(b, groups, s, d, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    choices = [(name, False) for name in BACKENDS]
    if groups != heads:
        choices += [(name, True) for name in BACKENDS]
    times = {}
    for name, native in choices:
        try:
            with sdpa_kernel(BACKENDS[name]):
                for i in range(iters + 3):
                    if i == 3:
                        start = torch.cuda.Event(enable_timing=True)
                        end = torch.cuda.Event(enable_timing=True)
                        start.record()
                    attention(q, k, v, dropout, native).sum().backward()
                end.record()
                torch.cuda.synchronize()
            times[name + ("+gqa" if native else "")] = round(
                start.elapsed_time(end) / iters, 3)
        except (RuntimeError, NotImplementedError, ValueError):
            torch.cuda.synchronize()
    del q, k, v
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return times


def print_profile(step, steps, name, dropout):
    """Prints to stderr the device time per step of each kernel over STEPS
    profiled steps (torch.profiler), the largest first: where PyTorch's time
    goes, beside megatron-train's MTRT_CUDA_PROFILE=1 table."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            step(i)
        torch.cuda.synchronize()
    rows = [(e.device_time_total / steps / 1e3, e.count // steps, e.key)
            for e in prof.key_averages() if e.device_time_total > 0]
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"== profile {name} dropout {dropout}: {total:.2f} ms of kernels "
          "a step (ms, launches a step, kernel)", file=sys.stderr)
    for ms, count, key in rows[:40]:
        print(f"{ms:9.3f} {count:5d}  {key[:150]}", file=sys.stderr)
    sys.stderr.flush()


def run(m, args, dropout):
    b = args.micro_batch_size or m["micro_batch_size"]
    s = m["seq_length"]
    times = {}
    if args.sdpa == "best":
        times = time_attention(m, b, dropout)
        if not times:
            raise SystemExit("no SDPA backend takes this shape and dropout")
        choice = min(times, key=times.get)
    else:
        choice = args.sdpa
    backend, native_gqa = choice.split("+")[0], choice.endswith("+gqa")
    use_backend(backend)
    torch.manual_seed(1234)
    hf = args.llama == "hf"
    if hf and not m["llama"]:
        raise SystemExit(f"--llama hf: {m['name']} is not a Llama "
                         "(position_embedding_type rope)")
    model = (HfLlama(m, dropout) if hf else Model(m, dropout, native_gqa))
    model = model.cuda()
    step_model = model
    if args.compile == "model":
        step_model = torch.compile(model)
    elif args.compile == "blocks":
        model.compile_regions()
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    vectors = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": 0.1},
         {"params": vectors, "weight_decay": 0.0}],
        lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    # Token ids below the unpadded vocabulary, a few batches in turn.
    batches = [torch.randint(0, m["vocab_size"], (b, s + 1), device="cuda")
               for _ in range(4)]

    parameters = list(model.parameters())

    def step(i):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(batches[i % len(batches)])
        loss.backward()
        if args.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(parameters, args.clip_grad,
                                           foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True),
               torch.cuda.Event(enable_timing=True)) for _ in range(args.steps)]
    losses = []
    for i, (start, end) in enumerate(events):
        start.record()
        losses.append(step(i).detach())
        end.record()
    torch.cuda.synchronize()
    ms = statistics.median(start.elapsed_time(end) for start, end in events)
    if args.profile:
        print_profile(step, args.profile, m["name"], dropout)
    tokens_per_second = b * s / (ms / 1e3)
    result = {
        "impl": ("hf-llama-" if hf else "torch-") +
                ("compile" if args.compile != "eager" else "eager"),
        "compile": args.compile,
        "model": m["name"], "micro_batch_size": b, "seq_length": s,
        "dropout": dropout, "clip_grad": args.clip_grad,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "sdpa": choice, "sdpa_ms": times,
        "parameters": sum(p.numel() for p in model.parameters()),
        "ms_per_step": round(ms, 2),
        "tokens_per_second": round(tokens_per_second, 1),
        "mfu": round(modelfile.mfu(m, tokens_per_second), 4),
        "max_memory_reserved": torch.cuda.max_memory_reserved(),
        "max_memory_allocated": torch.cuda.max_memory_allocated(),
        "last_loss": round(float(losses[-1]), 4),
    }
    del model, step_model, optimizer, batches, losses
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_file", help="models/*.yaml")
    parser.add_argument("--micro-batch-size", type=int, default=0,
                        help="default: the model file's")
    parser.add_argument("--dropout", type=float, nargs="+", default=[0.0],
                        help="one run for each value (default 0)")
    parser.add_argument("--sdpa", default="best",
                        choices=["best"] + list(BACKENDS) +
                        [b + "+gqa" for b in BACKENDS])
    parser.add_argument("--compile", default="blocks",
                        choices=["blocks", "model", "eager"],
                        help="blocks (default): each block and the loss "
                             "compiled apart; model: the whole model as one "
                             "graph (several times the compile time); "
                             "eager: no compile, for reference")
    parser.add_argument("--llama", default="lean", choices=["lean", "hf"],
                        help="for a Llama model file: the lean model "
                             "(default) or Hugging Face's LlamaForCausalLM")
    parser.add_argument("--clip-grad", type=float, default=1.0,
                        help="clip the gradients to this global norm "
                             "(default 1.0, megatron-train's; 0: none)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, metavar="STEPS",
                        help="after the timed steps, print to stderr each "
                             "kernel's device time a step over STEPS "
                             "profiled steps (default 0: none)")
    args = parser.parse_args()
    m = modelfile.load(args.model_file)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    for dropout in args.dropout:
        try:
            result = run(m, args, dropout)
        except torch.OutOfMemoryError as e:
            result = {"model": m["name"], "dropout": dropout,
                      "micro_batch_size": args.micro_batch_size,
                      "error": "out of memory: " + str(e).split("\n")[0]}
        print(json.dumps(result), flush=True)
        # Each run's peaks are its own: the next starts from an empty cache.
        torch._dynamo.reset()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


if __name__ == "__main__":
    main()

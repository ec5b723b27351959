#!/usr/bin/env python3
"""GPT training steps in PyTorch (eager or torch.compile), at the shapes
megatron-train runs: the same models as models/gpt2-124m.yaml,
gpt2-350m.yaml and gpt-1.3b.yaml (vocabulary padded to 50304, learned
positions, tanh GeLU, tied embeddings, dropout 0.1, biases), AdamW (betas
0.9/0.95, weight decay 0.01 on matrices), global-norm clipping to 1.0, one
micro-batch per step. --precision bf16 runs the step under autocast to bf16
(fp32 master weights and optimizer state), as mixed-precision training does.

Prints one JSON line: tokens/s (median over the timed steps), ms per step,
peak memory. Each step ends with loss.item(), as megatron-train's does.

  python3 bench/torch_gpt2.py --micro-batch-size 8 --tf32 0 --attention sdpa
  python3 bench/torch_gpt2.py --model gpt-1.3b --micro-batch-size 8 \
      --precision bf16 --compile 1
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 50304
# (layers, hidden, heads, seq) of models/*.yaml.
MODELS = {"gpt2-124m": (12, 768, 12, 1024), "gpt2-350m": (24, 1024, 16, 1024),
          "gpt-1.3b": (24, 2048, 16, 2048)}
LAYERS, HIDDEN, HEADS, SEQ = MODELS["gpt2-124m"]


class Attention(nn.Module):
    def __init__(self, dropout, kind):
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)
        self.dropout = dropout
        self.kind = kind
        self.resid = nn.Dropout(dropout)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).split(HIDDEN, dim=2)
        q, k, v = (t.view(b, s, HEADS, HIDDEN // HEADS).transpose(1, 2)
                   for t in (q, k, v))
        if self.kind == "sdpa":
            y = F.scaled_dot_product_attention(
                q, k, v, is_causal=True,
                dropout_p=self.dropout if self.training else 0.0)
        else:  # "math": the textbook formula, materializing the scores
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(HIDDEN // HEADS)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~mask, float("-inf"))
            p = F.dropout(scores.softmax(-1), self.dropout, self.training)
            y = p @ v
        y = y.transpose(1, 2).reshape(b, s, HIDDEN)
        return self.resid(self.proj(y))


class Block(nn.Module):
    def __init__(self, dropout, kind):
        super().__init__()
        self.ln1 = nn.LayerNorm(HIDDEN, eps=1e-5)
        self.attn = Attention(dropout, kind)
        self.ln2 = nn.LayerNorm(HIDDEN, eps=1e-5)
        self.fc = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.out = nn.Linear(4 * HIDDEN, HIDDEN)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        h = F.gelu(self.fc(self.ln2(x)), approximate="tanh")
        return x + self.drop(self.out(h))


class GPT(nn.Module):
    def __init__(self, dropout=0.1, kind="sdpa"):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, HIDDEN)
        self.wpe = nn.Embedding(SEQ, HIDDEN)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dropout, kind) for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(HIDDEN, eps=1e-5)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.drop(self.wte(tokens) + self.wpe(positions))
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.t()  # tied output layer


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2-124m")
    parser.add_argument("--precision", choices=["fp32", "bf16"],
                        default="fp32")
    parser.add_argument("--compile", type=int, default=0,
                        help="1: torch.compile the model")
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--tf32", type=int, default=0)
    parser.add_argument("--attention", choices=["sdpa", "math"], default="sdpa")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--profile", type=int, default=0,
                        help="1: after the timed steps, print the CUDA "
                             "kernels of 3 more steps (torch.profiler)")
    args = parser.parse_args()
    global LAYERS, HIDDEN, HEADS, SEQ
    LAYERS, HIDDEN, HEADS, SEQ = MODELS[args.model]

    torch.backends.cuda.matmul.allow_tf32 = bool(args.tf32)
    torch.backends.cudnn.allow_tf32 = bool(args.tf32)
    torch.manual_seed(1234)
    device = torch.device("cuda")
    model = GPT(kind=args.attention).to(device)
    forward = torch.compile(model) if args.compile else model
    autocast = torch.autocast("cuda", dtype=torch.bfloat16,
                              enabled=args.precision == "bf16")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=6e-4, betas=(0.9, 0.95), eps=1e-8)
    b = args.micro_batch_size
    tokens_per_step = b * SEQ

    def step():
        x = torch.randint(0, 50257, (b, SEQ + 1), device=device)
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            logits = forward(x[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB).float(),
                                   x[:, 1:].reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        return loss.item()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times, loss = [], 0.0
    for _ in range(args.steps):
        start = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    print(json.dumps({
        "impl": "torch-compile" if args.compile else "torch-eager",
        "model": args.model,
        "precision": args.precision,
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "attention": args.attention,
        "tf32": bool(args.tf32),
        "micro_batch_size": b,
        "parameters": sum(p.numel() for p in model.parameters()),
        "ms_per_step": round(seconds * 1e3, 2),
        "tokens_per_second": round(tokens_per_step / seconds, 1),
        "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "last_loss": round(loss, 4),
    }), flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cuda_time_total",
                                        row_limit=40, max_name_column_width=90))


if __name__ == "__main__":
    main()

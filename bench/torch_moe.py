"""A PyTorch mixture-of-experts layer at mtrt-moe-bench's shapes
(runtime/tools/mtrt-moe-bench.cpp), for the ratio in bench/NOTES.md: the
router in fp32 (linear, softmax top-k normalized), the tokens permuted into
expert order (a stable argsort), the experts' SwiGLU MLPs as grouped GEMMs
(torch._grouped_mm, bf16, gate and up [E, hidden, ffn], down [E, ffn,
hidden]), the rows weighted and summed back per token; forward and forward
+ backward through autograd (the weights' gradients included).

TFLOP/s count the same products as mtrt-moe-bench: the experts' 3 GEMMs of
2 S h f (S = tokens x top-k) and the router's 2 T h E, times 3 for forward +
backward. Milliseconds are the median of the timed calls.
"""
import argparse

import torch
import torch.nn.functional as F


def median_ms(body, repeats):
    for _ in range(2):
        body()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        body()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def moe_layer(x, router, gate, up, down, topk):
    """x [T, h] bf16; router [E, h] fp32; gate, up [E, h, f]; down [E, f, h]."""
    tokens, hidden = x.shape
    experts = router.shape[0]
    logits = x.float() @ router.t()
    top, chosen = torch.topk(logits, topk, dim=-1)
    weights = torch.softmax(top, dim=-1)  # normalized top-k
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=experts)
    offsets = torch.cumsum(counts, 0).to(torch.int32)
    rows = x[order // topk]
    g = torch._grouped_mm(rows, gate, offs=offsets)
    u = torch._grouped_mm(rows, up, offs=offsets)
    o = torch._grouped_mm(F.silu(g) * u, down, offs=offsets)
    weighted = o * weights.reshape(-1)[order].unsqueeze(1).to(o.dtype)
    y = torch.zeros_like(x)
    y.index_add_(0, order // topk, weighted)
    return y


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=7168)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--topk", type=int, default=2)
    a = parser.parse_args()
    torch.manual_seed(1234)
    dev = "cuda"
    bf16 = torch.bfloat16
    x = torch.randn(a.tokens, a.hidden, device=dev, dtype=bf16,
                    requires_grad=True)
    router = (0.02 * torch.randn(a.experts, a.hidden, device=dev)
              ).requires_grad_()
    def weight(*shape):
        return (0.02 * torch.randn(*shape, device=dev)).to(bf16
                                                          ).requires_grad_()
    # _grouped_mm's second operand [E, K, N]: stored transposed, as the
    # runtime's [E, out, in] weights are.
    gate = weight(a.experts, a.ffn, a.hidden).transpose(1, 2)
    up = weight(a.experts, a.ffn, a.hidden).transpose(1, 2)
    down = weight(a.experts, a.hidden, a.ffn).transpose(1, 2)
    dy = torch.randn(a.tokens, a.hidden, device=dev, dtype=bf16)

    def forward():
        with torch.no_grad():
            moe_layer(x, router, gate, up, down, a.topk)

    def step():
        y = moe_layer(x, router, gate, up, down, a.topk)
        y.backward(dy)

    forward_ms = median_ms(forward, a.repeats)
    step_ms = median_ms(step, a.repeats)
    slots = a.tokens * a.topk
    flops = 3 * 2 * slots * a.hidden * a.ffn + 2 * a.tokens * a.hidden * a.experts
    print(f"torch_moe: tokens {a.tokens} hidden {a.hidden} ffn {a.ffn} "
          f"experts {a.experts} top-{a.topk}, bf16, torch {torch.__version__} "
          f"on {torch.cuda.get_device_name()}")
    print(f"  forward            {forward_ms:8.3f} ms  "
          f"{flops / forward_ms * 1e-9:6.1f} TFLOP/s")
    print(f"  forward+backward   {step_ms:8.3f} ms  "
          f"{3 * flops / step_ms * 1e-9:6.1f} TFLOP/s")


if __name__ == "__main__":
    main()

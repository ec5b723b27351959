"""PyTorch's scaled_dot_product_attention at the attention micro-benchmark's
shapes (runtime/tools/mtrt-attention-bench.cpp), for the ratios in
bench/NOTES.md: bf16 q, k, v [batch, heads, seq, head_dim], causal, dropout
0.1 and 0, forward and backward, per SDPA backend.

TFLOP/s count the visible (causal) half: forward 4 b h s^2 d / 2, backward
2.5 times that. Milliseconds are the median of the timed calls (with
--sustain N: the mean of N calls back to back).
"""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# Issue 22's shapes, then the step table's other two models': (name, batch,
# seq, query heads, key/value heads, head dimension), as
# runtime/tools/mtrt-attention-bench.cpp lists them.
SHAPES = [
    ("gpt2-124m", 32, 1024, 12, 12, 64),
    ("gpt-1.3b", 8, 2048, 16, 16, 128),
    ("s4096", 4, 4096, 32, 32, 128),
    ("s8192", 2, 8192, 16, 16, 128),
    ("gqa-4096", 4, 4096, 32, 8, 128),
    ("gpt2-350m", 32, 1024, 16, 16, 64),
    ("llama-1.5b", 4, 2048, 32, 8, 64),
]
ISSUE_22_SHAPES = "gpt2-124m,gpt-1.3b,s4096,s8192,gqa-4096"
BACKENDS = {
    "default": None,
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def median_ms(body, repeats, sustain=0):
    """The median of REPEATS timed calls after two warm-up calls; with
    SUSTAIN, the mean of SUSTAIN calls back to back after SUSTAIN more (the
    clock and power the GPU holds under that load, as in a training step:
    mtrt-attention-bench's MTRT_BENCH_SUSTAIN)."""
    if sustain:
        for _ in range(sustain):
            body()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(sustain):
            body()
        stop.record()
        stop.synchronize()
        return start.elapsed_time(stop) / sustain
    for _ in range(2):
        body()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        body()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    times.sort()
    return times[len(times) // 2]


def measure(shape, dropout, backend, repeats, sustain=0):
    name, b, s, hq, hkv, d = shape
    q = torch.randn(b, hq, s, d, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16,
                    requires_grad=True)
    gqa = hq != hkv

    def forward():
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout,
                                              is_causal=True, enable_gqa=gqa)

    def run(body):
        if backend is None:
            return body()
        with sdpa_kernel([backend]):
            return body()

    fwd = run(lambda: median_ms(forward, repeats, sustain))
    out = run(forward)
    grad = torch.randn_like(out)

    def backward():
        # A fresh forward each time (its graph is freed by backward); its time
        # is subtracted below.
        o = forward()
        o.backward(grad)

    both = run(lambda: median_ms(backward, repeats, sustain))
    flop = 4.0 * b * hq * s * s * d / 2
    bwd = both - fwd
    return fwd, flop / fwd * 1e-9, bwd, 2.5 * flop / bwd * 1e-9


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sustain", type=int, default=0, metavar="N",
                        help="time N calls back to back after N more "
                             "(default 0: the median of --repeats calls)")
    parser.add_argument("--backends", default="default,flash,cudnn,efficient")
    parser.add_argument("--dropouts", default="0.1,0",
                        help="comma-separated dropout probabilities")
    parser.add_argument("--shapes", default=ISSUE_22_SHAPES,
                        help="comma-separated shape names, or 'all' "
                             "(default: issue 22's five)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, cudnn {torch.backends.cudnn.version()}, "
          f"{torch.cuda.get_device_name()}")
    print(f"{'shape':10} {'backend':9} {'dropout':>7} {'fwd ms':>9} "
          f"{'fwd TF/s':>9} {'bwd ms':>9} {'bwd TF/s':>9}")
    names = args.shapes.split(",")
    for shape in SHAPES:
        if args.shapes != "all" and shape[0] not in names:
            continue
        for dropout in [float(x) for x in args.dropouts.split(",")]:
            for name in args.backends.split(","):
                try:
                    fwd, fwd_tf, bwd, bwd_tf = measure(
                        shape, dropout, BACKENDS[name], args.repeats,
                        args.sustain)
                    print(f"{shape[0]:10} {name:9} {dropout:7.1f} {fwd:9.3f} "
                          f"{fwd_tf:9.1f} {bwd:9.3f} {bwd_tf:9.1f}", flush=True)
                except Exception as error:  # a backend refusing the shape
                    first = str(error).strip().splitlines()[0][:90]
                    print(f"{shape[0]:10} {name:9} {dropout:7.1f} "
                          f"unavailable: {first}", flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

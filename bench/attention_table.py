"""Issue 22's attention table from one device call's two benchmarks:
runtime/tools/mtrt-attention-bench (this project's flash attention) and
bench/torch_sdpa.py (PyTorch's SDPA backends), same GPU, bf16, causal.

For each shape and dropout: TFLOP/s of the forward and of forward plus
backward (the visible causal half: forward 4 b h s^2 d / 2, backward 2.5
times that), ours against cuDNN's and FlashAttention-2's, and the ratios
ours / cuDNN (at least 1 is the goal; 0.9 with dropout). Ours is shown
two ways: through cuDNN's fused attention (the faster of "cudnn" and
"cudnn-qkv": the runtime's path without dropout, cuda/CudnnAttention.h)
on the Hopper kernels (the faster of "hopper" and "hopper-qkv":
cuda/kernels/HopperAttention.h, wgmma and TMA, the runtime's path where
cuDNN does not run) and on the own mma.sync kernels (the faster of the two
bf16 layouts, separate q, k, v: "bf16"; one packed qkv tensor: "qkv"; the
deterministic backward apart). The first ratios are those of the path the
runtime takes: cuDNN's where it ran, else the Hopper kernels', else the
own kernels'; the last two the Hopper kernels' alone.

Usage: attention_table.py OURS.txt TORCH.txt > table.md
"""
import sys


def read(path, key_column):
    """{(shape, key, dropout): (fwd_ms, bwd_ms)} from a benchmark's lines."""
    rows = {}
    for line in open(path):
        fields = line.split()
        if len(fields) != 7:
            continue
        try:
            values = [float(x) for x in fields[2:]]
        except ValueError:
            continue
        shape, key = fields[0], fields[key_column]
        rows[(shape, key, values[0])] = (values[1], values[3], values[2])
    return rows


def main():
    ours = read(sys.argv[1], 1)
    torch = read(sys.argv[2], 1)
    shapes = []
    for shape, _, dropout in list(ours) + list(torch):
        if (shape, dropout) not in shapes:
            shapes.append((shape, dropout))

    def rates(entry):
        """(forward TF/s, forward+backward TF/s) of (fwd_ms, bwd_ms, fwd_tf)."""
        fwd_ms, bwd_ms, fwd_tf = entry
        flop = fwd_tf * fwd_ms * 1e9  # the forward's FLOPs
        return fwd_tf, 3.5 * flop / ((fwd_ms + bwd_ms) * 1e9)

    print("| shape | dropout | ours cuDNN path fwd | ours cuDNN path fwd+bwd "
          "| ours Hopper fwd | ours Hopper fwd+bwd "
          "| ours own kernel fwd | ours own kernel fwd+bwd | cuDNN fwd | cuDNN "
          "fwd+bwd | FA2 fwd | FA2 fwd+bwd | ours/cuDNN fwd | ours/cuDNN "
          "fwd+bwd | Hopper/cuDNN fwd | Hopper/cuDNN fwd+bwd |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
          "---:|---:|---:|")
    for shape, dropout in shapes:
        def best(ios):
            mine = [rates(ours[k]) for k in ours
                    if k[0] == shape and k[2] == dropout and k[1] in ios]
            return max(mine, key=lambda r: r[1]) if mine else None

        via_cudnn = best(("cudnn", "cudnn-qkv"))
        hopper = best(("hopper", "hopper-qkv"))
        own = best(("bf16", "qkv"))
        taken = via_cudnn or hopper or own
        cudnn = torch.get((shape, "cudnn", dropout))
        flash = torch.get((shape, "flash", dropout))
        cudnn = rates(cudnn) if cudnn else None
        flash = rates(flash) if flash else None

        def show(pair, i):
            return f"{pair[i]:.0f}" if pair else "-"

        def ratio(i, mine=None):
            mine = mine or taken
            return f"{mine[i] / cudnn[i]:.2f}" if mine and cudnn else "-"

        print(f"| {shape} | {dropout:.1f} | {show(via_cudnn, 0)} | "
              f"{show(via_cudnn, 1)} | {show(hopper, 0)} | {show(hopper, 1)} | "
              f"{show(own, 0)} | {show(own, 1)} | "
              f"{show(cudnn, 0)} | {show(cudnn, 1)} | {show(flash, 0)} | "
              f"{show(flash, 1)} | {ratio(0)} | {ratio(1)} | "
              f"{ratio(0, hopper) if hopper else '-'} | "
              f"{ratio(1, hopper) if hopper else '-'} |")


if __name__ == "__main__":
    main()

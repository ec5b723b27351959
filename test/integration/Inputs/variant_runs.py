"""What fused-gemm-runs.py and recompute-runs.py share: compiling a variant
of MODEL, training it 3 iterations on the CPU, and comparing the variants'
logs with same-losses.py. A bundle for several ranks trains them as threads
(--in-process-ranks) and saves its weights only when asked (megatron-train
puts the ranks' shards together into whole tensors).
"""
import os
import subprocess
import sys


def in_process_ranks(flags):
    """megatron-train's flags for a bundle compiled with `flags`."""
    return ["--in-process-ranks"] if any("parallel-size" in f for f in flags) \
        else []


def compile_and_train(compile_tool, train_tool, root, model_file, stem, flags,
                      ranks, save_weights=False):
    """Compiles `model_file` with `flags` to STEM.mtb and trains it, logging
    to STEM.jsonl and (one rank, or any with `save_weights`) saving
    STEM.safetensors; returns both paths."""
    subprocess.run([compile_tool, model_file, "-o", stem + ".mtb"] + flags,
                   check=True)
    saves = not ranks or save_weights
    subprocess.run(
        [train_tool, stem + ".mtb", "--data-path",
         os.path.join(root, "data", "corpus.txt"), "--train-iters", "3",
         "--lr", "1e-3", "--eval-interval", "0", "--no-progress-bar",
         "--log-jsonl", stem + ".jsonl"] + ranks +
        (["--save-weights", stem + ".safetensors"] if saves else []),
        check=True, stdout=subprocess.DEVNULL)
    return stem + ".jsonl", stem + ".safetensors"


def expect_same_losses(logs):
    """Runs same-losses.py over the logs (its output after ours)."""
    sys.stdout.flush()
    subprocess.run([sys.executable,
                    os.path.join(os.path.dirname(__file__), "same-losses.py")]
                   + logs, check=True)

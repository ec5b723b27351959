#!/usr/bin/env python3
"""Prints the throughput table of bench/run-device-checks.sh: megatron-train's
--log-jsonl files and torch_gpt2.py's JSON lines, per model, with MFU as
../shared/DESIGN.md defines it: (6N + 12 L h s) * tokens/s / 989 TFLOP/s,
N = parameters without the position embeddings, and each run's ratio to
torch.compile (bf16) of the same model and micro-batch.

  python3 bench/summarize.py --mtrt MODEL,MB,NAME=run.jsonl:run.log[:PEAK] \\
      ... --torch torch.jsonl
PEAK: a file holding the largest device memory in MiB seen during the run.
"""
import argparse
import json
import re
import statistics

# (layers, hidden, seq) of models/*.yaml.
MODELS = {"gpt2-124m": (12, 768, 1024), "gpt2-350m": (24, 1024, 1024),
          "gpt-1.3b": (24, 2048, 2048)}
PEAK = 989e12


def mfu(model, parameters, tokens_per_second):
    layers, hidden, seq = MODELS[model]
    n = parameters - seq * hidden  # without the position embeddings
    return (6 * n + 12 * layers * hidden * seq) * tokens_per_second / PEAK


def mtrt_row(spec, skip):
    head, paths = spec.split("=", 1)
    model, mb, name = head.split(",", 2)
    parts = paths.split(":")
    jsonl, log = parts[0], parts[1]
    records = [json.loads(line) for line in open(jsonl) if line.strip()]
    records = [r for r in records if "tokens_per_second" in r]
    timed = [r["tokens_per_second"] for r in records[skip:]] or \
        [r["tokens_per_second"] for r in records]
    text = open(log).read()
    match = re.search(r"\((\d+) parameters", text)
    parameters = int(match.group(1)) if match else 0
    tps = statistics.median(timed)
    peak = float("nan")
    if len(parts) > 2:
        try:
            peak = float(open(parts[2]).read().split()[0]) / 1024
        except (OSError, ValueError, IndexError):
            pass
    return {"model": model, "mb": int(mb), "name": name,
            "tokens_per_second": tps,
            "ms_per_step": int(mb) * MODELS[model][2] / tps * 1e3,
            "mfu": mfu(model, parameters, tps) if parameters else float("nan"),
            "peak": peak,
            "last_loss": records[-1]["loss"] if records else float("nan")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mtrt", action="append", default=[],
                        help="MODEL,MB,NAME=JSONL:LOG[:PEAK] of a run")
    parser.add_argument("--torch", default=None, help="torch_gpt2.py output")
    parser.add_argument("--skip", type=int, default=5,
                        help="warm-up iterations left out of the median")
    args = parser.parse_args()

    rows = []
    for spec in args.mtrt:
        try:
            rows.append(mtrt_row(spec, args.skip))
        except (OSError, ValueError, statistics.StatisticsError) as e:
            print(f"{spec}: no figures ({e})")
    if args.torch:
        for line in open(args.torch):
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            model = r.get("model", "gpt2-124m")
            name = (f"torch {'compile' if 'compile' in r['impl'] else 'eager'}"
                    f", {r.get('precision', 'fp32')}, {r['attention']}"
                    f"{', tf32' if r['tf32'] else ''}")
            rows.append({"model": model, "mb": r["micro_batch_size"],
                         "name": name,
                         "tokens_per_second": r["tokens_per_second"],
                         "ms_per_step": r["ms_per_step"],
                         "mfu": mfu(model, r["parameters"],
                                    r["tokens_per_second"]),
                         "peak": r["peak_memory_gib"],
                         "last_loss": r["last_loss"]})
    print(f"{'model':10} {'mb':>3} {'run':34} {'tokens/s':>10} {'ms/step':>9} "
          f"{'MFU':>7} {'peak GiB':>8} {'/compile':>8}")
    for r in rows:
        ref = [x for x in rows if x["model"] == r["model"] and
               x["mb"] == r["mb"] and x["name"].startswith("torch compile, bf16")]
        ratio = (r["tokens_per_second"] / ref[0]["tokens_per_second"]
                 if ref else float("nan"))
        print(f"{r['model']:10} {r['mb']:3d} {r['name'][:34]:34} "
              f"{r['tokens_per_second']:10.0f} {r['ms_per_step']:9.1f} "
              f"{100 * r['mfu']:6.2f}% {r['peak']:8.1f} {ratio:8.2f}")


if __name__ == "__main__":
    main()

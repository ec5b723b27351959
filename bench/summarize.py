#!/usr/bin/env python3
"""Prints the GPT-2 124M throughput table from megatron-train's --log-jsonl
files and torch_gpt2.py's JSON lines, with MFU as ../shared/DESIGN.md defines
it: (6N + 12 L h s) * tokens/s / 989 TFLOP/s, N = parameters without the
position embeddings.

  python3 bench/summarize.py --mtrt NAME=run.jsonl:run.log ... --torch torch.jsonl
"""
import argparse
import json
import re
import statistics

LAYERS, HIDDEN, SEQ = 12, 768, 1024
PEAK = 989e12


def mfu(parameters, tokens_per_second):
    n = parameters - SEQ * HIDDEN  # without the position embeddings
    return (6 * n + 12 * LAYERS * HIDDEN * SEQ) * tokens_per_second / PEAK


def mtrt_row(name, jsonl, log, skip):
    records = [json.loads(line) for line in open(jsonl) if line.strip()]
    records = [r for r in records if "tokens_per_second" in r]
    timed = [r["tokens_per_second"] for r in records[skip:]] or \
        [r["tokens_per_second"] for r in records]
    match = re.search(r"\((\d+) parameters", open(log).read())
    parameters = int(match.group(1)) if match else 124475904
    tps = statistics.median(timed)
    return {"name": name, "tokens_per_second": tps,
            "ms_per_step": 8 * SEQ / tps * 1e3, "mfu": mfu(parameters, tps),
            "last_loss": records[-1]["loss"] if records else float("nan")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mtrt", action="append", default=[],
                        help="NAME=JSONL:LOG of a megatron-train run")
    parser.add_argument("--torch", default=None, help="torch_gpt2.py output")
    parser.add_argument("--skip", type=int, default=10,
                        help="warm-up iterations left out of the median")
    args = parser.parse_args()

    rows = []
    for spec in args.mtrt:
        name, paths = spec.split("=", 1)
        jsonl, log = paths.split(":", 1)
        try:
            rows.append(mtrt_row(name, jsonl, log, args.skip))
        except (OSError, ValueError, statistics.StatisticsError) as e:
            print(f"{name}: no figures ({e})")
    if args.torch:
        for line in open(args.torch):
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            name = f"torch eager, {r['attention']} attention, " \
                   f"tf32 {'on' if r['tf32'] else 'off'}"
            rows.append({"name": name,
                         "tokens_per_second": r["tokens_per_second"],
                         "ms_per_step": r["ms_per_step"],
                         "mfu": mfu(r["parameters"], r["tokens_per_second"]),
                         "last_loss": r["last_loss"]})
    print(f"{'run':58} {'tokens/s':>10} {'ms/step':>9} {'MFU':>7}")
    for r in rows:
        print(f"{r['name']:58} {r['tokens_per_second']:10.0f} "
              f"{r['ms_per_step']:9.1f} {100 * r['mfu']:6.2f}%")


if __name__ == "__main__":
    main()

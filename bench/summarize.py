#!/usr/bin/env python3
"""Prints the throughput table of bench/run-device-checks.sh: megatron-train's
--log-jsonl files and torch_step.py's JSON lines, per model, with MFU as
../shared/DESIGN.md defines it (modelfile.py), and each run's ratio to
torch.compile of the same model and micro-batch.

  python3 bench/summarize.py --mtrt MODEL,MB,NAME=run.jsonl:run.log[:PEAK] \\
      ... --torch torch.jsonl
PEAK: a file holding the largest device memory in MiB seen during the run.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modelfile  # noqa: E402

MODELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                      "models")


def model_file(model):
    return modelfile.load(os.path.join(MODELS, model + ".yaml"))


def mtrt_row(spec, skip):
    head, paths = spec.split("=", 1)
    model, mb, name = head.split(",", 2)
    parts = paths.split(":")
    jsonl, log = parts[0], parts[1]
    records = [json.loads(line) for line in open(jsonl) if line.strip()]
    records = [r for r in records if "tokens_per_second" in r]
    timed = [r["tokens_per_second"] for r in records[skip:]] or \
        [r["tokens_per_second"] for r in records]
    tps = statistics.median(timed)
    m = model_file(model)
    peak = float("nan")
    if len(parts) > 2:
        try:
            peak = float(open(parts[2]).read().split()[0]) / 1024
        except (OSError, ValueError, IndexError):
            pass
    return {"model": model, "mb": int(mb), "name": name,
            "tokens_per_second": tps,
            "ms_per_step": int(mb) * m["seq_length"] / tps * 1e3,
            "mfu": modelfile.mfu(m, tps),
            "peak": peak,
            "last_loss": records[-1]["loss"] if records else float("nan")}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mtrt", action="append", default=[],
                        help="MODEL,MB,NAME=JSONL:LOG[:PEAK] of a run")
    parser.add_argument("--torch", default=None, help="torch_step.py output")
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
            if "error" in r:
                print(f"torch {r['model']} dropout {r['dropout']}: "
                      f"{r['error']}")
                continue
            rows.append({"model": r["model"], "mb": r["micro_batch_size"],
                         "name": f"torch {r['compile']}, dropout "
                                 f"{r['dropout']:g}, {r['sdpa']}",
                         "tokens_per_second": r["tokens_per_second"],
                         "ms_per_step": r["ms_per_step"],
                         "mfu": r["mfu"],
                         "peak": r["max_memory_reserved"] / 2**30,
                         "last_loss": r["last_loss"]})
    print(f"{'model':10} {'mb':>3} {'run':34} {'tokens/s':>10} {'ms/step':>9} "
          f"{'MFU':>7} {'peak GiB':>8} {'/compile':>8}")
    for r in rows:
        ref = [x for x in rows if x["model"] == r["model"] and
               x["mb"] == r["mb"] and x["name"].startswith("torch blocks")]
        ratio = (r["tokens_per_second"] / ref[0]["tokens_per_second"]
                 if ref else float("nan"))
        print(f"{r['model']:10} {r['mb']:3d} {r['name'][:34]:34} "
              f"{r['tokens_per_second']:10.0f} {r['ms_per_step']:9.1f} "
              f"{100 * r['mfu']:6.2f}% {r['peak']:8.1f} {ratio:8.2f}")


if __name__ == "__main__":
    main()

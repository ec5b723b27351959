"""The table of bench/run-step-table.sh: megatron-train beside torch.compile
at each model's shape and dropout, and the largest micro-batch search.

Usage: step_table.py DIR LOGS OUT
       step_table.py DIR LOGS --search-start MODEL-mbMB-d0
  DIR   the folder bench/make-step-dir.sh filled (bundles/NAME.memory.txt,
        models/*.yaml)
  LOGS  the runs: NAME.{jsonl,log,mem,before,status} for each bundle NAME =
        MODEL-mbMB-dD (and tiny-gpt), torch-MODEL.jsonl (torch_step.py),
        torch-check-MODEL.jsonl (torch_step.py --compile model),
        torch-hf-MODEL.jsonl (torch_step.py --llama hf), NAME.alt.* (the
        runs under run-step-table.sh's ALT_ENV or ALT_BIN)
  OUT   where step-table.json and step-table.md go; the markdown is printed

Ours: the step time is the median of megatron-train's elapsed_ms from
iteration 4 on; the peak is nvidia-smi's largest memory in use during the
run, minus what was in use before it and minus the CUDA context (tiny-gpt's
peak minus its own reported total); "reported" is --report memory's total.
PyTorch: torch_step.py's figures (median step between CUDA events,
max_memory_reserved, max_memory_allocated). MFU as modelfile.py defines it.
ratio = torch.compile's step time / ours (above 1: ours is faster). SM MHz:
the median SM clock (and power) over a run's samples drawing at least 85% of
its largest power (the steps); torch_step.py's one process runs both
dropouts (and compiles).

--search-start prints the largest micro-batch search's candidates for MODEL
(the bundles MODEL-mbN-d0 with N > MB), ascending, on one line, and on the
next the index of the first to try: the largest whose reported total, scaled
by the measured/reported ratio of the run MODEL-mbMB-d0 (1 if it failed),
fits the device's memory (nvidia-smi's total) minus the context.
"""
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import modelfile  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30
NAME = re.compile(r"^(.+)-mb(\d+)-d([0-9.]+)$")


def reported_total(bundles, name):
    text = open(os.path.join(bundles, name + ".memory.txt")).read()
    return int(re.search(r"\n  total\s+(\d+)", text).group(1))


def samples(logs, tag):
    """The run's samples: (MiB in use, SM MHz or None, W or None) each
    (run-step-table.sh's state; older logs hold the memory alone)."""
    rows = []
    for line in open(os.path.join(logs, tag + ".mem")):
        fields = [f.strip() for f in line.split(",")]
        if not fields[0].isdigit():
            continue
        try:
            mhz, watts = float(fields[1]), float(fields[2])
        except (IndexError, ValueError):
            mhz = watts = None
        rows.append((int(fields[0]), mhz, watts))
    return rows


def peak_bytes(logs, tag):
    """The largest memory in use during the run minus that before it."""
    memory = [m for m, _, _ in samples(logs, tag)]
    before = int(open(os.path.join(logs, tag + ".before")).read().strip())
    return (max(memory) - before) * MIB if memory else None


def clock(logs, tag):
    """The median SM clock and power over the run's samples that draw at
    least 85% of its largest power (its steps, not its start-up, which
    takes most of a large model's run), as "MHz (W)"."""
    drawn = [(w, mhz) for _, mhz, w in samples(logs, tag) if w is not None]
    if not drawn:
        return "-"
    most = max(w for w, _ in drawn)
    busy = [(w, mhz) for w, mhz in drawn if w >= 0.85 * most]
    return (f"{statistics.median(m for _, m in busy):.0f} "
            f"({statistics.median(w for w, _ in busy):.0f} W)")


def ours(dir_, logs, name, context, tag=None):
    """Bundle NAME's run, logged under TAG (default NAME)."""
    tag = tag or name
    model, mb, dropout = NAME.match(name).groups()
    m = modelfile.load(os.path.join(dir_, "models", model + ".yaml"))
    status = int(open(os.path.join(logs, tag + ".status")).read())
    row = {"model": model, "micro_batch_size": int(mb),
           "dropout": float(dropout), "exit_status": status,
           "reported_total": reported_total(os.path.join(dir_, "bundles"),
                                             name)}
    records = []
    path = os.path.join(logs, tag + ".jsonl")
    if os.path.exists(path):
        records = [json.loads(line) for line in open(path) if line.strip()]
    steps = [r["elapsed_ms"] for r in records if r["iteration"] >= 4] or \
        [r["elapsed_ms"] for r in records[1:]]
    if status != 0 or not steps:
        log = open(os.path.join(logs, tag + ".log")).read()
        lines = [line for line in log.splitlines() if line.strip()]
        row["error"] = ("out of memory" if re.search(
            r"out of memory|cudaErrorMemoryAllocation", log, re.I)
            else (lines[-1][:200] if lines else "no output"))
        return row
    ms = statistics.median(steps)
    tokens_per_second = int(mb) * m["seq_length"] / (ms / 1e3)
    peak = peak_bytes(logs, tag)
    row.update({"ms_per_step": round(ms, 2),
                "tokens_per_second": round(tokens_per_second, 1),
                "mfu": round(modelfile.mfu(m, tokens_per_second), 4),
                "peak": peak - context if peak is not None else None,
                "sm_clock": clock(logs, tag),
                "last_loss": records[-1]["loss"]})
    if row["peak"]:
        row["reported_over_measured"] = round(
            row["reported_total"] / row["peak"], 4)
    return row


def gib(value):
    return f"{value / GIB:.1f}" if value else "-"


def percent(value):
    return f"{100 * value:.1f}%" if value is not None else "-"


def search_start(dir_, logs, bundles, context, base):
    model, base_mb, _ = NAME.match(base).groups()
    candidates = sorted(
        int(NAME.match(n[:-4]).group(2)) for n in os.listdir(bundles)
        if n.endswith("-d0.mtb") and NAME.match(n[:-4]) and
        NAME.match(n[:-4]).group(1) == model and
        int(NAME.match(n[:-4]).group(2)) > int(base_mb))
    scale = 1.0
    if os.path.exists(os.path.join(logs, base + ".status")):
        row = ours(dir_, logs, base, context)
        if row.get("peak"):
            scale = max(1.0, row["peak"] / row["reported_total"])
    device = int(subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.total",
         "--format=csv,noheader,nounits"], capture_output=True,
        text=True).stdout.split()[0]) * MIB
    start = 0
    for i, mb in enumerate(candidates):
        if reported_total(bundles, f"{model}-mb{mb}-d0") * scale < \
                device - context:
            start = i
    print(" ".join(map(str, candidates)))
    print(start)


def main():
    dir_, logs = sys.argv[1:3]
    bundles = os.path.join(dir_, "bundles")
    context = peak_bytes(logs, "tiny-gpt") - reported_total(bundles,
                                                            "tiny-gpt")
    if sys.argv[3] == "--search-start":
        search_start(dir_, logs, bundles, context, sys.argv[4])
        return
    out = sys.argv[3]
    ours_rows = {}
    for entry in sorted(os.listdir(logs)):
        name = entry[:-len(".status")]
        if entry.endswith(".status") and NAME.match(name):
            if not os.path.exists(os.path.join(bundles, name + ".memory.txt")):
                continue  # a run of a bundle this folder does not hold
            row = ours(dir_, logs, name, context)
            ours_rows[(row["model"], row["micro_batch_size"],
                       row["dropout"])] = row
    torch_rows, checks, hf_rows = {}, [], []
    for entry in sorted(os.listdir(logs)):
        if entry.startswith("torch-") and entry.endswith(".jsonl"):
            for line in open(os.path.join(logs, entry)):
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                if entry.startswith("torch-check-"):
                    checks.append(r)
                elif entry.startswith("torch-hf-"):
                    hf_rows.append(r)
                else:
                    torch_rows[(r["model"], r["micro_batch_size"],
                                r["dropout"])] = r
    compared, search = [], []
    keys = sorted(set(ours_rows) | set(torch_rows),
                  key=lambda k: (modelfile.parameters(modelfile.load(
                      os.path.join(dir_, "models", k[0] + ".yaml"))), k))
    for key in keys:
        o, t = ours_rows.get(key), torch_rows.get(key)
        # Only the compared shapes have a dropout-0.1 bundle.
        if o and not os.path.exists(os.path.join(
                bundles, f"{key[0]}-mb{key[1]}-d0.1.mtb")):
            search.append(o)
            continue
        row = {"model": key[0], "micro_batch_size": key[1],
               "dropout": key[2], "ours": o, "torch": t}
        name = f"{key[0]}-mb{key[1]}-d{key[2]:g}"
        # torch_step.py runs both dropouts in one process: one clock.
        if t and os.path.exists(os.path.join(logs, f"torch-{key[0]}.mem")):
            t = row["torch"] = dict(t, sm_clock=clock(logs,
                                                      f"torch-{key[0]}"))
        if os.path.exists(os.path.join(logs, name + ".alt.status")):
            row["ours_alt"] = ours(dir_, logs, name, context, name + ".alt")
        if o and t and "ms_per_step" in o and "ms_per_step" in t:
            row["ratio"] = round(t["ms_per_step"] / o["ms_per_step"], 3)
            if o.get("peak"):
                row["ours_peak_over_torch_reserved"] = round(
                    o["peak"] / t["max_memory_reserved"], 3)
        compared.append(row)
    json.dump({"context_bytes": context, "rows": compared, "search": search,
               "torch_compile_checks": checks, "hugging_face_llama": hf_rows},
              open(os.path.join(out, "step-table.json"), "w"), indent=1)

    clips = sorted({str(r["torch"].get("clip_grad", "none (before "
                                         "torch_step.py --clip-grad)"))
                    for r in compared if r["torch"]})
    # An "ours ALT ms" column where run-step-table.sh's ALT_ENV or ALT_BIN
    # ran.
    alts = any("ours_alt" in r for r in compared)
    header = (["model", "mb", "dropout", "ours ms"] +
              (["ours ALT ms"] if alts else []) +
              ["torch ms", "ratio", "ours tokens/s", "ours MFU", "torch MFU",
               "ours peak GiB", "reported GiB", "torch reserved GiB",
               "torch allocated GiB", "torch SDPA", "ours SM MHz",
               "torch SM MHz"])
    aligns = ["---"] + ["---:"] * (len(header) - 4) + ["---"] * 3
    lines = [f"CUDA context (tiny-gpt's peak minus its reported total): "
             f"{context / MIB:.0f} MiB", "",
             f"Gradient clipping, torch's side (ours: megatron-train "
             f"--clip-grad, the same value): {', '.join(clips) or '-'}", "",
             "| " + " | ".join(header) + " |", "|" + "|".join(aligns) + "|"]
    for r in compared:
        o, t = r["ours"] or {}, r["torch"] or {}
        cells = [r["model"], r["micro_batch_size"], f"{r['dropout']:g}",
                 o.get("ms_per_step", o.get("error", "-")),
                 t.get("ms_per_step", t.get("error", "-")),
                 r.get("ratio", "-"), o.get("tokens_per_second", "-"),
                 percent(o.get("mfu")), percent(t.get("mfu")),
                 gib(o.get("peak")), gib(o.get("reported_total")),
                 gib(t.get("max_memory_reserved")),
                 gib(t.get("max_memory_allocated")), t.get("sdpa", "-"),
                 o.get("sm_clock", "-"), t.get("sm_clock", "-")]
        if alts:
            alt = r.get("ours_alt", {})
            cells.insert(4, alt.get("ms_per_step", alt.get("error", "-")))
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if search:
        lines += ["", "Largest micro-batch, ours, no recomputation, "
                  "dropout 0:", "",
                  "| model | mb | result | ms | tokens/s | MFU | peak GiB "
                  "| reported GiB |", "|---|---:|---|---:|---:|---:|---:|---:|"]
        for o in search:
            cells = [o["model"], o["micro_batch_size"],
                     "ran" if "ms_per_step" in o else o.get("error", "-"),
                     o.get("ms_per_step", "-"),
                     o.get("tokens_per_second", "-"), percent(o.get("mfu")),
                     gib(o.get("peak")), gib(o["reported_total"])]
            lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    for c in checks:
        regional = torch_rows.get((c["model"], c["micro_batch_size"],
                                   c["dropout"]), {})
        lines.append(
            f"\ntorch.compile of the whole model as one graph, {c['model']} "
            f"mb {c['micro_batch_size']} dropout {c['dropout']:g}: "
            f"{c.get('ms_per_step', c.get('error'))} ms, reserved "
            f"{gib(c.get('max_memory_reserved'))} GiB (the blocks compiled "
            f"apart: {regional.get('ms_per_step', '-')} ms, "
            f"{gib(regional.get('max_memory_reserved'))} GiB)")
    for h in hf_rows:
        o = ours_rows.get((h["model"], h["micro_batch_size"], h["dropout"]),
                          {})
        ratio = "-"
        if "ms_per_step" in h and "ms_per_step" in o:
            ratio = round(h["ms_per_step"] / o["ms_per_step"], 3)
        lines.append(
            f"\nHugging Face's LlamaForCausalLM under torch.compile (the "
            f"second baseline), {h['model']} mb {h['micro_batch_size']} "
            f"dropout {h['dropout']:g}: {h.get('ms_per_step', h.get('error'))} "
            f"ms, MFU {percent(h.get('mfu'))}, reserved "
            f"{gib(h.get('max_memory_reserved'))} GiB, SDPA "
            f"{h.get('sdpa', '-')}; ours {o.get('ms_per_step', '-')} ms: "
            f"ratio {ratio}")
    text = "\n".join(lines) + "\n"
    open(os.path.join(out, "step-table.md"), "w").write(text)
    print(text)


if __name__ == "__main__":
    main()

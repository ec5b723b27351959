#!/usr/bin/env python3
"""bench/run-scaling.sh's report (issue 29).

  scaling_table.py ROOT BUNDLES LOGS GPUS   the layouts' table and
                                            issue 29's acceptance lines
  scaling_table.py --faults LOGS RANKS      the fault runs' lines

BUNDLES is compile-scaling-bundles.sh's folder (layouts.tsv, NAME.step.txt),
LOGS run-scaling.sh's (NAME.log, the references' logs, launched.tsv).
Efficiency = tokens/s of the layout / (GPUs x tokens/s of one GPU at the
same global batch); MFU per GPU as ../shared/DESIGN.md defines it
(bench/modelfile.py; not for mixture-of-experts models, whose N would count
every expert). The loss tolerance is the bf16 one of the CUDA tests (2e-2
relative, every iteration).
"""
import os
import re
import statistics
import sys

TOLERANCE = 2e-2
MODEL_FILES = {"gpt-1.3b": ("gpt-1.3b.yaml", {}),
               "llama-1.5b": ("llama-1.5b.yaml", {}),
               "mixtral": None}


def iterations(path):
    """Each logged iteration's loss, ms and tokens/s (any rank's lines)."""
    rows = []
    try:
        lines = open(path, errors="replace").readlines()
    except OSError:
        return rows
    for line in lines:
        loss = re.search(r"lm loss: ([0-9.E+-]+)", line)
        if not loss:
            continue
        ms = re.search(r"per iteration \(ms\): ([0-9.]+)", line)
        rate = re.search(r"tokens per second: ([0-9.]+)", line)
        rows.append(dict(loss=float(loss.group(1)),
                         ms=float(ms.group(1)) if ms else float("nan"),
                         rate=float(rate.group(1)) if rate else float("nan")))
    return rows


def steady(rows, key, skip=5):
    """The median after the first iterations (start-up, graph capture)."""
    values = [r[key] for r in rows[skip:]]
    return statistics.median(values) if values else float("nan")


def prediction(path):
    """--report step's step, makespan, bubble and exposed communication."""
    try:
        text = open(path).read()
    except OSError:
        return None
    m = re.search(r"step ([0-9.]+) ms = makespan ([0-9.]+) ms \(kernels "
                  r"[0-9.]+, collectives and sends ([0-9.]+), bubble "
                  r"([0-9.]+)\) \+ data-parallel exposed ([0-9.]+)", text)
    if not m:
        return None
    step, makespan, comm, bubble, dp = map(float, m.groups())
    return dict(step=step, bubble=bubble / makespan, comm=comm + dp)


def layouts(root, bundles, logs, gpus):
    launched = {}
    try:
        for line in open(os.path.join(logs, "launched.tsv")):
            name, how = line.rstrip("\n").split("\t")
            launched[name] = how
    except OSError:
        pass
    print()
    print("| layout | GPUs | launched by | scaling | ms/iter (one GPU) | "
          "tokens/s per GPU | efficiency | MFU per GPU | predicted step ms "
          "(bubble, exposed communication ms) | largest relative loss "
          "difference (iteration) | within 2e-2 |")
    print("|---|---:|---|---|---:|---:|---:|---:|---|---|---|")
    checks = []
    for line in open(os.path.join(bundles, "layouts.tsv")):
        (label, need, launcher, model, scaling, batch, name, ref,
         flags) = line.rstrip("\n").split("\t")
        need = int(need)
        p = prediction(os.path.join(bundles, name + ".step.txt"))
        predicted = (f"{p['step']:.1f} ({p['bubble']:.1%}, {p['comm']:.1f})"
                     if p else "")
        if need > gpus:
            print(f"| {label} | {need} | | {scaling} | needs {need} GPUs, "
                  f"not run | | | | {predicted} | | |")
            continue
        if name not in launched:
            continue  # left out by LAYOUTS
        a = iterations(os.path.join(logs, name + ".log"))
        b = iterations(os.path.join(logs, ref + ".log"))
        n = min(len(a), len(b))
        if n == 0:
            print(f"| {label} | {need} | {launched[name]} | {scaling} | no "
                  f"iterations logged (layout {len(a)}, one GPU {len(b)}) "
                  f"| | | | {predicted} | | NO |")
            checks.append((label, "ran", False))
            continue
        diffs = [abs(x["loss"] - y["loss"]) / abs(y["loss"])
                 for x, y in zip(a[:n], b[:n])]
        worst = max(range(n), key=lambda i: diffs[i])
        within = diffs[worst] <= TOLERANCE and len(a) == len(b)
        ms, ms1 = steady(a, "ms"), steady(b, "ms")
        rate, rate1 = steady(a, "rate"), steady(b, "rate")
        efficiency = rate / (need * rate1)
        mfu = ""
        if MODEL_FILES.get(model):
            # Imported here: it needs PyYAML, which the table of a run that
            # logged nothing (the compile-only test) does not.
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import modelfile
            path, overrides = MODEL_FILES[model]
            m = modelfile.load(os.path.join(root, "models", path), overrides)
            mfu = f"{modelfile.mfu(m, rate / need):.1%}"
        note = "" if len(a) == len(b) else f" ({len(a)} of {len(b)})"
        print(f"| {label} | {need} | {launched[name]} | {scaling} | "
              f"{ms:.1f} ({ms1:.1f}) | {rate / need:,.0f} | "
              f"{efficiency:.3f} | {mfu} | {predicted} | "
              f"{diffs[worst]:.2g} ({worst + 1}){note} | "
              f"{'yes' if within else 'NO'} |")
        checks.append((label, "parity", within))
        if re.fullmatch(r"\S+ DP\d+,.*overlap", label) and scaling == "weak":
            checks.append((label, f"efficiency {efficiency:.3f} >= 0.97",
                           efficiency >= 0.97))
        if label.startswith("gpt-1.3b TP2") and need == 2:
            checks.append((label, f"efficiency {efficiency:.3f} >= 0.90",
                           efficiency >= 0.90))
        if re.fullmatch(r"\S+ PP2.*", label) and p:
            bound = 0.95 * (1 - p["bubble"])
            checks.append((label, f"efficiency {efficiency:.3f} >= 0.95 x "
                           f"(1 - predicted bubble {p['bubble']:.3f}) = "
                           f"{bound:.3f}", efficiency >= bound))
    print()
    print("Issue 29's acceptance, row by row (efficiency: with overlap for "
          "data parallelism; every gpt-1.3b TP2 row; PP2 against its "
          "predicted bubble):")
    for label, what, ok in checks:
        print(f"- {label}: {what}: {'holds' if ok else 'DOES NOT HOLD'}")


def faults(logs, ranks):
    """Each fault run: how every rank ended and what the survivors said."""
    print()
    for kind in ("kill", "stop"):
        path = os.path.join(logs, f"fault-{kind}.log")
        try:
            lines = open(path, errors="replace").read().splitlines()
        except OSError:
            print(f"fault ({kind}): no log")
            continue
        event = None
        ends = {}
        said = {}
        for line in lines:
            m = re.match(r"\[rank (\d+)\] (.*)", line)
            if not m:
                continue
            r, text = int(m.group(1)), m.group(2)
            e = re.match(r"ended: (.*) after ([0-9.]+) s", text)
            if e:
                ends[r] = (e.group(1), float(e.group(2)))
                s = re.match(r"stopped at ([0-9.]+) s", e.group(1))
                if e.group(1) == "killed" or s:
                    event = float(s.group(1)) if s else 20.0
            elif text.startswith("mtrt: ") or "error" in text:
                said[r] = text
        ok = event is not None and len(ends) == ranks
        print(f"fault ({kind} rank 1 at {event} s, collective timeout 10 s):")
        for r in sorted(ends):
            how, at = ends[r]
            if r == 1:
                print(f"- rank 1: {how}")
                continue
            late = at - event if event is not None else float("nan")
            message = said.get(r, "")
            names = all(re.search(p, message) for p in
                        (rf"rank {r}\b", r"step \d+", r"group ",
                         r"all_reduce|all_gather|reduce_scatter|broadcast|"
                         r"send|recv|barrier"))
            within = late <= 20.0 and how != "exit 0"
            ok = ok and within and names
            print(f"- rank {r}: {how} {late:.1f} s after it "
                  f"({'within' if within else 'NOT within'} 10 + 10 s); "
                  f"{'names' if names else 'does NOT name'} rank, "
                  f"collective, step and group: {message[:300]}")
        print(f"- {'holds' if ok else 'DOES NOT HOLD'}")
    try:
        print(open(os.path.join(logs, "reshard.txt")).read().rstrip())
    except OSError:
        print("reshard: no record")


if __name__ == "__main__":
    if sys.argv[1] == "--faults":
        faults(sys.argv[2], int(sys.argv[3]))
    else:
        layouts(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))

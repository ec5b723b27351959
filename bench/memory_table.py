"""The memory acceptance table of bench/run-memory-checks.sh.

Usage: memory_table.py BUNDLES OUT
Reads each BUNDLES/NAME.memory.txt (megatron-compile --report memory) and the
run's OUT/NAME.{log,jsonl,mem,before}; prints per bundle the reported and
measured arena and total, their ratio (measured / reported) and whether it
is within 3%, and the step time, then the verdicts: every reported figure
within 3% of the measured one, and the automatic policy (NAME.auto) fitting
and no slower than full uniform 1.

"Reported arena": the report's activations (the train_step arena of the
bundle's memory plan, values and side buffers). "Measured arena": the arena
megatron-train allocated (its "arena N MiB" line). "Reported total": the
report's total (weights, gradients, Adam moments, the arena; cuBLASLt's
workspace is in the arena's GEMM side buffers). "Measured total": nvidia-smi's peak memory in use during the
run, minus what was in use before it and minus the CUDA context and
libraries, measured as tiny-gpt's peak minus its own reported total.
"""
import json
import os
import re
import statistics
import sys

MIB = 1 << 20
TOLERANCE = 0.03
bundles, out = sys.argv[1], sys.argv[2]


def report(name):
    text = open(os.path.join(bundles, name + ".memory.txt")).read()

    def row(label):
        return int(re.search(r"\n  " + re.escape(label) + r"\s+(\d+)",
                             text).group(1))
    policy = re.search(r"recompute (.+?), \d+ rank", text).group(1)
    return {"policy": policy,
            "arena": row("activations (train_step arena peak)"),
            "total": row("total")}


def measured(name):
    log = open(os.path.join(out, name + ".log")).read()
    arena = re.search(r"arena (\d+) MiB", log)
    samples = [int(line) for line in open(os.path.join(out, name + ".mem"))
               if line.strip().isdigit()]
    before = int(open(os.path.join(out, name + ".before")).read().strip())
    steps = []
    if os.path.exists(os.path.join(out, name + ".jsonl")):
        for line in open(os.path.join(out, name + ".jsonl")):
            entry = json.loads(line)
            if entry["iteration"] >= 3:
                steps.append(entry["elapsed_ms"])
    return {"arena": int(arena.group(1)) * MIB if arena else None,
            "peak": (max(samples) - before) * MIB if samples else None,
            "step_ms": statistics.mean(steps) if steps else None,
            "ok": "exit status 0" in open(os.path.join(
                out, "memory-summary.txt")).read().split(name + ":")[1][:20]}


tiny_report, tiny = report("tiny-gpt"), measured("tiny-gpt")
context = tiny["peak"] - tiny_report["total"]
assumed = re.search(r"\n    with the CUDA context\s+(\d+)", open(
    os.path.join(bundles, "tiny-gpt.memory.txt")).read())
print(f"CUDA context and libraries (tiny-gpt's peak minus its reported "
      f"total): {context / MIB:.0f} MiB" +
      (f"; the report adds {(int(assumed.group(1)) - tiny_report['total']) / MIB:.0f} MiB"
       if assumed else ""))
names = sorted(n[:-len(".memory.txt")] for n in os.listdir(bundles)
               if n.endswith(".memory.txt") and n != "tiny-gpt.memory.txt")
print(f"{'bundle':<22} {'policy':<16} {'arena rep':>10} {'arena meas':>10} "
      f"{'ratio':>6} {'':>4} {'total rep':>10} {'total meas':>10} "
      f"{'ratio':>6} {'':>4} {'step ms':>8}")


def verdict(ratio):
    return "ok" if abs(ratio - 1) <= TOLERANCE else "FAIL"



failures, rows = [], {}
for name in names:
    r, m = report(name), measured(name)
    rows[name] = (r, m)
    arena_ratio = m["arena"] / r["arena"] if m["arena"] else float("nan")
    total = m["peak"] - context if m["peak"] else None
    total_ratio = total / r["total"] if total else float("nan")
    step = f"{m['step_ms']:.0f}" if m["step_ms"] else "-"
    print(f"{name:<22} {r['policy']:<16} {r['arena'] / 2**30:>9.2f}G "
          f"{(m['arena'] or 0) / 2**30:>9.2f}G {arena_ratio:>6.3f} "
          f"{verdict(arena_ratio):>4} "
          f"{r['total'] / 2**30:>9.2f}G {(total or 0) / 2**30:>9.2f}G "
          f"{total_ratio:>6.3f} {verdict(total_ratio):>4} {step:>8}")
    for what, ratio in (("arena", arena_ratio), ("total", total_ratio)):
        if verdict(ratio) != "ok":
            failures.append(f"{name}: {what} measured/reported {ratio:.3f}, "
                            f"outside 3%")
for model in sorted({n.rsplit(".", 1)[0] for n in names}):
    auto, full = rows.get(model + ".auto"), rows.get(model + ".uniform1")
    if not auto or not full:
        continue
    if not auto[1]["ok"]:
        failures.append(f"{model}.auto ({auto[0]['policy']}) did not run")
    elif (auto[1]["step_ms"] or 1e30) > (full[1]["step_ms"] or 0):
        failures.append(f"{model}.auto ({auto[0]['policy']}): "
                        f"{auto[1]['step_ms']:.0f} ms per step, full uniform "
                        f"1 {full[1]['step_ms']:.0f} ms")
    else:
        print(f"{model}: automatic picked {auto[0]['policy']}, ran in its "
              f"budget, {auto[1]['step_ms']:.0f} ms per step against full "
              f"uniform 1's {full[1]['step_ms']:.0f} ms")
print("\n".join(failures) if failures else
      "every reported figure within 3% of the measured one")
sys.exit(1 if failures else 0)

"""Checks megatron-compile --memory-budget on a pipeline layout against the
reports of every policy (memory-budget-pipeline.test): compiles --report
memory under none, selective, full block N and full uniform N (N up to the
layers per stage), takes each policy's largest pipeline rank total, and for
a budget of each of those totals expects the first policy in the chooser's
order (less recomputation first) whose every rank fits; then checks that
the chosen report fits on every rank. A budget one byte below the least
total must fail.

Usage: budget-choice.py MEGATRON_COMPILE MODEL LAYERS_PER_STAGE FLAG...
"""
import re
import subprocess
import sys

compile_tool, model, per_stage = sys.argv[1:4]
flags = sys.argv[4:]
per_stage = int(per_stage)

policies = [("none", ["--recompute-granularity", "none"]),
            ("selective", ["--recompute-granularity", "selective"])]
for method in ("block", "uniform"):
    for n in range(1 if method == "block" else 2, per_stage + 1):
        policies.append((f"full {method} {n}",
                         ["--recompute-granularity", "full",
                          "--recompute-method", method,
                          "--recompute-num-layers", str(n)]))


def totals(report):
    return [int(t) for t in re.findall(r"\n  total\s+(\d+)", report)]


def compile_report(extra):
    result = subprocess.run([compile_tool, model, "--report", "memory"] +
                            flags + extra, capture_output=True, text=True)
    return result.returncode, result.stdout + result.stderr


largest = {}
for name, extra in policies:
    code, report = compile_report(extra)
    if code:
        sys.exit(f"recompute {name} does not compile:\n{report}")
    largest[name] = max(totals(report))

for name, _ in policies:
    budget = largest[name]
    expected = next(p for p, _ in policies if largest[p] <= budget)
    code, report = compile_report(["--memory-budget", str(budget)])
    if code:
        sys.exit(f"budget {budget}: failed:\n{report}")
    chosen = re.search(r"recompute (.+?) \(layers counted per stage\)",
                       report).group(1)
    if chosen != expected:
        sys.exit(f"budget {budget}: chose {chosen}, expected {expected}")
    if max(totals(report)) > budget:
        sys.exit(f"budget {budget}: {chosen} does not fit: {totals(report)}")
    print(f"budget {budget} ({name}'s largest rank): recompute {chosen}, "
          f"every rank fits: {totals(report)}")

least = min(largest.values())
code, report = compile_report(["--memory-budget", str(least - 1)])
if code == 0:
    sys.exit(f"budget {least - 1}: accepted, but no policy fits")
print(report.strip())

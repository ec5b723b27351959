"""Compares the functions that mtrt.h declares (MTRT_API) with the dynamic
symbols libmtrt.so defines: each must be exported, and nothing else may be
(C++ standard library instantiations, the engine's classes, ...).

Usage: check-api-exports.py MTRT_H NM_OUTPUT
(NM_OUTPUT: the output of `nm -D --defined-only libmtrt.so`)."""
import re
import sys

header = open(sys.argv[1]).read()
declared = set(re.findall(r"MTRT_API\b[^;{]*?\b(mtrt_\w+)\s*\(", header, re.S))
exported = set()
others = []
for line in open(sys.argv[2]):
    fields = line.split()
    if len(fields) < 2 or fields[-2] == "A":  # version nodes
        continue
    name = fields[-1]
    if name in ("_init", "_fini", "__bss_start", "_edata", "_end"):
        continue
    if name.startswith("mtrt_"):
        exported.add(name)
    else:
        others.append(name)

status = 0
for name in sorted(others):
    print(f"exported but not mtrt_: {name}")
    status = 1
for name in sorted(declared - exported):
    print(f"declared in mtrt.h but not exported: {name}")
    status = 1
for name in sorted(exported - declared):
    print(f"exported but not declared in mtrt.h: {name}")
    status = 1
print(f"{len(declared)} functions declared, {len(exported)} exported, "
      f"{len(others)} other symbols")
sys.exit(status)

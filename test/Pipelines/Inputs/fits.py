"""Checks that a --report memory total is at most BUDGET bytes.

Usage: fits.py REPORT BUDGET
"""
import re
import sys

text = open(sys.argv[1]).read()
total = int(re.search(r"\n  total\s+(\d+)", text).group(1))
budget = int(sys.argv[2])
if total > budget:
    sys.exit(f"total {total} exceeds the budget {budget}")
print(f"total {total} fits {budget}")

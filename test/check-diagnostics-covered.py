#!/usr/bin/env python3
"""Checks that every diagnostic a dialect's C++ emits is expected by a test.

For each statement that calls emitError() or emitOpError(), the longest
string literal in it (adjacent literals joined) must appear inside some
`expected-error {{...}}` of the .mlir tests. Prints how many diagnostics were
checked; exits 1 and lists the uncovered ones otherwise.

Usage: check-diagnostics-covered.py SOURCE_DIR TEST_DIR
"""
import pathlib
import re
import sys

EMIT = re.compile(r"emit(?:Op)?Error\(\)")
LITERAL = re.compile(r'"((?:[^"\\]|\\.)*)"')
ADJACENT = re.compile(r'"\s*\n\s*"')
EXPECTED = re.compile(r"expected-(?:error|warning|remark)[^{]*\{\{(.*)\}\}")


def statements_with_diagnostics(source: str):
    """Yields (line, statement) for each statement that emits a diagnostic."""
    for match in EMIT.finditer(source):
        start = source.rfind(";", 0, match.start()) + 1
        start = max(start, source.rfind("{", 0, match.start()) + 1)
        end = source.find(";", match.end())
        line = source.count("\n", 0, match.start()) + 1
        yield line, source[start:end]


def main() -> int:
    source_dir, test_dir = map(pathlib.Path, sys.argv[1:3])
    expected = [
        m.group(1)
        for path in test_dir.rglob("*.mlir")
        for m in EXPECTED.finditer(path.read_text())
    ]
    checked, uncovered = 0, []
    for path in sorted(source_dir.rglob("*.cpp")):
        for line, statement in statements_with_diagnostics(path.read_text()):
            literals = LITERAL.findall(ADJACENT.sub("", statement))
            if not literals:
                continue  # The statement builds no message of its own.
            key = max(literals, key=len).encode().decode("unicode_escape")
            checked += 1
            if not any(key in text for text in expected):
                uncovered.append(f"{path}:{line}: {key!r}")
    if uncovered:
        print("diagnostics that no test expects:")
        print("\n".join(uncovered))
        return 1
    print(f"all {checked} diagnostics are expected by a test")
    return 0


if __name__ == "__main__":
    sys.exit(main())

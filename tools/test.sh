#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test suite (lit + FileCheck
# under test/, the compiler's and the runtime's GoogleTest units) in one lit
# run, ending with one summary line: "tests: N passed, N failed, N skipped".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

"$root/tools/setup.sh"
"$root/tools/build.sh"

results="$build/test-results.xml"
status=0
/usr/lib/llvm-22/bin/lit -sv --xunit-xml-output "$results" \
  "$build/test" "$build/test/unit" || status=$?

python3 - "$results" <<'PY'
import sys
import xml.etree.ElementTree as ET

cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
passed = failed = skipped = 0
for case in cases:
    if case.find("failure") is not None or case.find("error") is not None:
        failed += 1
    elif case.find("skipped") is not None:
        skipped += 1
    else:
        passed += 1
print(f"tests: {passed} passed, {failed} failed, {skipped} skipped")
PY
exit $status

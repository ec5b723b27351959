#!/usr/bin/env bash
# Installs what is missing, builds, runs the model-file fuzzer briefly, and
# runs every test suite (lit + FileCheck under test/, the compiler's and the
# runtime's GoogleTest units) in one lit run, ending with one summary line:
# "tests: N passed, N failed, N skipped".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

"$root/tools/setup.sh"
"$root/tools/build.sh"

# The model-file fuzzer: built with clang-22 into its own tree (only the
# reader and the fuzzer, instrumented), run briefly over the bundled models.
# A crash, a sanitizer report or a hang fails the script (after the tests
# run); what it found is kept in $fuzz_build/fuzz-artifacts/.
status=0
fuzz_build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
if [[ ! -f "$fuzz_build/build.ninja" ]]; then
  cmake -S "$root" -B "$fuzz_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DMEGATRON_BUILD_FUZZERS=ON -DMEGATRON_BUILD_TESTS=OFF >/dev/null
fi
ninja -C "$fuzz_build" megatron-model-file-fuzzer
fuzz_corpus=$(mktemp -d)
trap 'rm -rf "$fuzz_corpus"' EXIT
cp "$root"/models/*.yaml "$root"/models/hf/*.json "$fuzz_corpus"/
mkdir -p "$fuzz_build/fuzz-artifacts"
fuzz_log="$fuzz_build/fuzz.log"
if ! "$fuzz_build/bin/megatron-model-file-fuzzer" -max_total_time=20 \
    -timeout=10 -dict="$root/tools/megatron-model-file-fuzzer/model-file.dict" \
    -artifact_prefix="$fuzz_build/fuzz-artifacts/" "$fuzz_corpus" \
    >"$fuzz_log" 2>&1; then
  tail -n 40 "$fuzz_log" >&2
  echo "fuzz: megatron-model-file-fuzzer failed; the input is in" \
    "$fuzz_build/fuzz-artifacts/, the log in $fuzz_log" >&2
  status=1
else
  runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$fuzz_log")
  echo "fuzz: megatron-model-file-fuzzer made ${runs:-?} runs in 20 s, no crash"
fi

results="$build/test-results.xml"
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

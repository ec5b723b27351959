#!/usr/bin/env bash
# Installs what is missing, builds, runs the fuzzers briefly, and
# runs every test suite (lit + FileCheck under test/, the compiler's and the
# runtime's GoogleTest units) in one lit run, ending with one summary line:
# "tests: N passed, N failed, N skipped".
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}

"$root/tools/setup.sh"
"$root/tools/build.sh"

# The fuzzers: built with clang-22 into their own tree (only the readers
# and the fuzzers, instrumented), run 20 s each: the model-file reader over
# the bundled models, the runtime's safetensors reader over a few small
# files. A crash, a sanitizer report or a hang fails the script (after the
# tests run); what it found is kept in $fuzz_build/fuzz-artifacts/.
status=0
fuzz_build=${FUZZ_BUILD_DIR:-$root/build-fuzz}
if [[ ! -f "$fuzz_build/build.ninja" ]]; then
  cmake -S "$root" -B "$fuzz_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER=clang-22 -DCMAKE_CXX_COMPILER=clang++-22 \
    -DMEGATRON_BUILD_FUZZERS=ON -DMEGATRON_BUILD_TESTS=OFF >/dev/null
fi
ninja -C "$fuzz_build" megatron-model-file-fuzzer mtrt-safetensors-fuzzer
mkdir -p "$fuzz_build/fuzz-artifacts"
fuzz_corpus=$(mktemp -d)
trap 'rm -rf "$fuzz_corpus"' EXIT

# run_fuzzer NAME DICT SEED_FILES...
run_fuzzer() {
  local name=$1 dict=$2
  shift 2
  local corpus="$fuzz_corpus/$name" log="$fuzz_build/$name.log"
  mkdir -p "$corpus"
  cp "$@" "$corpus"/
  if ! "$fuzz_build/bin/$name" -max_total_time=20 -timeout=10 \
      -dict="$dict" -artifact_prefix="$fuzz_build/fuzz-artifacts/" \
      "$corpus" >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz: $name failed; the input is in $fuzz_build/fuzz-artifacts/," \
      "the log in $log" >&2
    status=1
  else
    runs=$(sed -n 's/^Done \([0-9]*\) runs.*/\1/p' "$log")
    echo "fuzz: $name made ${runs:-?} runs in 20 s, no crash"
  fi
}
run_fuzzer megatron-model-file-fuzzer \
  "$root/tools/megatron-model-file-fuzzer/model-file.dict" \
  "$root"/models/*.yaml "$root"/models/hf/*.json
run_fuzzer mtrt-safetensors-fuzzer "$root/runtime/test/fuzz/safetensors.dict" \
  "$root"/runtime/test/fuzz/corpus/*

results="$build/test-results.xml"
# build/test/gpu: the CUDA backend's tests, where the CUDA toolkit is (their
# GPU cases report as skipped, with the reason, on a machine without a GPU).
suites=("$build/test" "$build/test/unit")
[[ -f "$build/test/gpu/lit.site.cfg.py" ]] && suites+=("$build/test/gpu")
/usr/lib/llvm-22/bin/lit -sv --xunit-xml-output "$results" "${suites[@]}" ||
  status=$?

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

#!/bin/bash
# Issue 20's device check in one call of the device tool (nvidia-h200): the
# CUDA test suite, then the composed layouts (pipeline x tensor x sequence x
# data parallelism, the distributed optimizer, recomputation) of
# test/integration/Inputs/composed-layouts.py trained in bf16 on the GPU,
# every rank of a layout sharing it.
#
# Made here (the build with -DMTRT_ENABLE_CUDA=ON):
#   ninja -C build
#   bench/make-device-dir.sh build build/bin/megatron-compile build-check/d
#   python3 test/integration/Inputs/composed-layouts.py --gpu-prepare \
#     build/bin/megatron-compile build/bin/megatron-train models \
#     data/corpus.txt build-check/composed [LAYOUT ...]
#   cp -r build-check/composed/gpu build-check/d/composed
#   tar czf build-check/d.tgz -C build-check d && rm -rf build-check/d
#   cp bench/run-composition-check.sh build-check/
# then through the device tool: command
#   bash build-check/run-composition-check.sh "$OUT"
# with carry ["build-check"]; afterwards, here:
#   python3 test/integration/Inputs/composed-layouts.py --gpu-compare \
#     build-check/composed <the fetched composed folder> [LAYOUT ...]
# What comes back: summary.txt, tests.log, composed/ (each run's log and
# JSON lines, as one composed.tgz).
#
# Environment: TESTS (the gtest filter, default all), TESTS_LIMIT (seconds,
# 240), RUNS_LIMIT (seconds for the composed runs, 300).
here=$(cd "$(dirname "$0")" && pwd)
out=$1
mkdir -p /tmp/check && tar xzf "$here/d.tgz" -C /tmp/check
d=/tmp/check/d
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
libdirs=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' \
  -o -name 'libcudnn.so.9' -o -name 'libnvrtc.so.13' \
  -o -name 'libnccl.so.2*' 2>/dev/null | xargs -r -n1 dirname | sort -u |
  tr '\n' ':')
export LD_LIBRARY_PATH="$d/lib:$libdirs:$d/fallback-lib"
export MTRT_CUDA_TEST_BUNDLES="$d/bundles"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv \
  >"$out/summary.txt" 2>&1

timeout "${TESTS_LIMIT:-240}" "$d/bin/mtrt-cuda-tests" \
  --gtest_filter="${TESTS:-*}" >"$out/tests.log" 2>&1
echo "mtrt-cuda-tests: exit $? at $(elapsed) s" >>"$out/summary.txt"
grep -E "^\[  FAILED|^\[  PASSED|^\[  SKIPPED \] [0-9]|Segmentation" \
  "$out/tests.log" | head -40 >>"$out/summary.txt"

mkdir -p "$out/composed"
(cd "$d/composed" && TRAIN="$d/bin/megatron-train" DATA="$d/corpus.txt" \
  OUT="$out/composed" timeout "${RUNS_LIMIT:-300}" bash runs.sh) \
  >>"$out/summary.txt" 2>&1
echo "composed runs: exit $? at $(elapsed) s, $(ls "$out"/composed/*.jsonl \
  2>/dev/null | wc -l) logs" >>"$out/summary.txt"
tar czf "$out/composed.tgz" -C "$out" composed && rm -rf "$out/composed"

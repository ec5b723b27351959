#!/bin/bash
# Assembles what bench/run-memory-checks.sh needs on the GPU machine into one
# folder (to carry through the device tool): the CUDA runtime build's
# megatron-train and libmtrt, the bundles and --report memory tables compiled
# here for gpt2-350m and gpt-1.3b under each recomputation policy (and the
# automatic one under a budget below the no-recompute total), tiny-gpt as the
# CUDA context's yardstick, the scripts and the corpus; and, when the build
# has them, mtrt-cuda-tests with its tiny bundles (test-bundles/), so that
# the same call checks that the CUDA backend runs correctly in the
# compiler's plans.
#
# Usage: bench/make-memory-dir.sh CUDA_BUILD COMPILER DEST
#   CUDA_BUILD  a runtime build with -DMTRT_ENABLE_CUDA=ON (bench/NOTES.md)
#   COMPILER    megatron-compile (a build of this tree)
#   DEST        the folder to fill (emptied first)
#   MODELS      (environment) "model:micro-batch ...", default
#               "gpt2-350m:32 gpt-1.3b:8"
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$1 compile=$2 dest=$3
source "$root/bench/bundle-dir.sh"
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/lib" "$dest/bundles" "$dest/fallback-lib" \
  "$dest/bench"
cp "$build/bin/megatron-train" "$dest/bin/"
cp -L "$build"/lib/libmtrt.so* "$dest/lib/" 2>/dev/null || true
for lib in "${fallback_libs[@]}"; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$dest/fallback-lib/"
done
cp "$root/bench/run-memory-checks.sh" "$root/bench/memory_table.py" \
  "$dest/bench/"
cp "$root/data/corpus.txt" "$dest/corpus.txt"
if [ -x "$build/bin/mtrt-cuda-tests" ]; then
  cp "$build/bin/mtrt-cuda-tests" "$dest/bin/"
  mkdir -p "$dest/test-bundles"
  for model in tiny-gpt tiny-llama; do
    "$compile" "$root/models/$model.yaml" --precision=fp32 \
      -o "$dest/test-bundles/$model.mtb"
    "$compile" "$root/models/$model.yaml" --bf16 \
      -o "$dest/test-bundles/$model-bf16.mtb"
  done
fi

b=$dest/bundles
bundle tiny-gpt "$root/models/tiny-gpt.yaml" --precision=fp32
for pair in ${MODELS:-gpt2-350m:32 gpt-1.3b:8}; do
  model=${pair%%:*} mb=${pair##*:}
  common=("$root/models/$model.yaml" --bf16 --micro-batch-size="$mb"
    --global-batch-size="$mb")
  bundle "$model.none" "${common[@]}" --recompute-granularity none
  bundle "$model.selective" "${common[@]}" --recompute-granularity selective
  bundle "$model.block4" "${common[@]}" --recompute-granularity full \
    --recompute-method block --recompute-num-layers 4
  bundle "$model.uniform1" "${common[@]}" --recompute-granularity full \
    --recompute-method uniform --recompute-num-layers 1
  # Automatic, under three quarters of the no-recompute total.
  total=$(awk '$1 == "total" {print $2}' "$b/$model.none.memory.txt")
  bundle "$model.auto" "${common[@]}" --memory-budget $((total * 3 / 4))
done
du -sh "$dest"

#!/bin/bash
# Fills a folder for bench/run-planner-check.sh on the GPU machine (issue 28):
# megatron-train, the libraries the device image lacks, the corpus, and one
# bundle per line of bench/planner-configs.txt, compiled as the planner
# compiles them (bf16, --fuse-kernels, --fuse-linear-cross-entropy).
#
# Usage: bench/make-planner-dir.sh BIN COMPILER DEST
#   BIN       a folder holding megatron-train built with -DMTRT_ENABLE_CUDA=ON
#   COMPILER  megatron-compile of the same tree
#   DEST      the folder to fill (emptied first)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$1 compile=$2 dest=$3
source "$root/bench/bundle-dir.sh"
rm -rf "$dest"
mkdir -p "$dest/bin" "$dest/bundles" "$dest/bench"
cp "$bin/megatron-train" "$dest/bin/"
tar -C /lib/x86_64-linux-gnu -czhf "$dest/fallback-lib.tgz" "${fallback_libs[@]}"
cp "$root/bench/run-planner-check.sh" "$root/bench/planner-configs.txt" \
  "$dest/bench/"
cp "$root/data/corpus.txt" "$dest/corpus.txt"
b=$dest/bundles
grep -v '^#' "$root/bench/planner-configs.txt" |
  while read -r name model global mb recompute; do
    [ -n "$name" ] || continue
    "$compile" "$root/models/$model.yaml" --bf16 --fuse-kernels \
      --fuse-linear-cross-entropy --global-batch-size "$global" \
      --micro-batch-size "$mb" --recompute-granularity "$recompute" \
      -o "$b/$name.mtb"
  done
du -sh "$dest"
